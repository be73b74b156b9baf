"""vLLM's order for a request whose KV is read from the DDR pool (``--pool-read-order vllm`` for
a connector that loads asynchronously, ``step`` for one that loads inside the step,
``InStepReadOrder``; ``connector``, whichever the pool profile's connector does; opt-in, the
default ``arrival`` stays behind every committed figure).

What vLLM's v1 scheduler does (vllm-project/vllm, ``vllm/v1/core/sched/``), and the rule each
fact gives here:

- The read starts when the scheduler reaches the request. ``scheduler.py`` ``Scheduler.schedule``
  walks the WAITING queue in order (``request_queue.py`` ``FCFSRequestQueue``: ``peek_request``,
  ``pop_request``) once the RUNNING requests have taken their share of the step's token budget,
  while budget is left and fewer than ``max_num_seqs`` run; only then does it ask the connector
  (``connector.get_num_new_matched_tokens``: the external hit and ``load_kv_async``), allocate
  the blocks (``kv_cache_manager.allocate_slots(..., delay_cache_blocks=load_kv_async)``) and
  tell the connector to load into them (``connector.update_state_after_alloc``; the load goes
  to the workers in ``build_connector_meta``). Rule: the read starts at the instant the engine's
  timing model would start the request's prefill (``prefill_start``: a running slot and the
  prefill stage free), not at its arrival.
- While it reads, it waits and others pass it. An asynchronous load schedules no tokens
  (``num_new_tokens = 0``); the request, now ``RequestStatus.WAITING_FOR_REMOTE_KVS``, goes to
  ``skipped_waiting_requests`` and the loop goes on to the requests behind it; at each later
  step ``_update_waiting_for_remote_kv`` finds it not ready and it is skipped again. Rule: while
  its read is under way, the requests behind it start as if it were not there.
- It keeps its place. The skipped requests are put back at the head of the waiting queue at the
  end of each ``schedule`` (``self.waiting.prepend_requests(skipped_waiting_requests)``;
  ``FCFSRequestQueue.prepend_requests`` is ``extendleft`` of a queue built by
  ``prepend_request``, so they keep their order). When the workers report the load done
  (``_update_from_kv_xfer_finished`` adds it to ``finished_recving_kv_req_ids``), the next
  ``schedule`` finds it ready (``_update_waiting_for_remote_kv``: blocks cached,
  ``num_computed_tokens`` set, status back to WAITING) and schedules it there, before every
  request still waiting. Rule: read, it is queued first: behind what has started, ahead of
  what has not.

Simplifications, the same as the default's: the pool is looked up when the request is sent
(vLLM asks the connector when it reaches it), its blocks are pinned at admission (vLLM
allocates them when the read starts), and the step between the read's end and the next
``schedule`` is the transfer's fixed cost. A request is held unbooked (the router hears of it
through ``Router.queued``) only while its engine has a read waiting or under way; otherwise it
is booked when sent, exactly as by default.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple, cast

from emulator.engine_model import Probe
from kvgate.contract.modes import PdMode, RoutingMode
from simulator.routing import Ask
from simulator.setup import FleetEvent, SimConfig
from simulator.simulation import Simulation, _Entry
from workload.hashing import PromptBlocks
from workload.model import Workload

_REACH = 9  # an engine's scheduler reaches the head of its waiting queue (after P/D's kinds)


class _Waiting(NamedTuple):
    """A request in an engine's waiting queue, not yet booked: what its send found."""

    i: int
    ask: Ask
    arrival: float
    probe: Probe
    ddr: int | None  # the pool's answer (None: no pool here)


class VllmReadOrder(Simulation):
    """The simulation with vLLM's order for requests reading from the pool (module docstring)."""

    lets_pass = True  # the requests behind a read start while it runs

    def __init__(self, workload: Workload, mode: RoutingMode | PdMode, config: SimConfig,
                 blocks: PromptBlocks | None = None) -> None:
        super().__init__(workload, mode, config, blocks)
        n = self.n
        self.waiting: list[deque[_Waiting]] = [deque() for _ in range(n)]
        self.reading = [0] * n  # reads under way, per engine
        self.reach_at: list[float | None] = [None] * n  # the engine's pending _REACH event

    def _send(self, e: int, i: int, ask: Ask, hashes: list[int], now: float) -> None:
        probe, ddr = self._arrive(e, i, ask, hashes, now)
        if not ddr and not self.waiting[e] and not self.reading[e]:
            self._admit(e, i, probe, ddr, ask, now)  # nothing can pass it: booked as by default
            return
        self.waiting[e].append(_Waiting(i, ask, now, probe, ddr))
        self.router.queued(self.addresses[e], ask)
        self._pump(e, now)

    def _pump(self, e: int, now: float) -> None:
        """Engine ``e``'s scheduler takes the head of its waiting queue while it reaches it by
        ``now``: a read starts (and the next request is reached at once), or a request is
        booked. Otherwise an event at the instant it will."""
        queue = self.waiting[e]
        engine = self.fleet.engines[e]
        while queue and (self.lets_pass or not self.reading[e]):
            head = queue[0]
            reach = (engine.scheduler.prefill_start(head.arrival) if engine.config.queueing
                     else head.arrival)
            if reach > now:
                pending = self.reach_at[e]
                if pending is None or reach < pending:
                    self.reach_at[e] = reach
                    self._push(reach, _REACH, e)
                return
            queue.popleft()
            if head.ddr:
                self._read(e, head.probe, head.i, head.ddr, head.arrival, head.ask, now)
                self.reading[e] += 1
            else:
                self._admit(e, head.i, head.probe, head.ddr, head.ask, head.arrival)

    def _dispatch(self, at: float, kind: int, data: _Entry) -> None:
        if kind != _REACH:
            super()._dispatch(at, kind, data)
        elif self.reach_at[e := cast("int", data)] == at:  # else superseded by an earlier one
            self.reach_at[e] = None
            self._pump(e, at)

    def _on_transfer_loaded(self, tid: int, at: float) -> None:
        """Read: booked now, so ahead of every request still waiting (vLLM's head of the
        queue); then the scheduler goes on."""
        e, gen = self.loading[tid][:2]
        live = gen == self.fleet.generation[e]
        super()._on_transfer_loaded(tid, at)
        if live:
            self.reading[e] -= 1
            self._pump(e, at)

    def _on_fleet_event(self, event: FleetEvent) -> None:
        """A failed engine loses its waiting queue too."""
        super()._on_fleet_event(event)
        e = event.engine
        if event.kind == "fail":
            for waiting in self.waiting[e]:
                self._failed(waiting.i, waiting.arrival, event.time)
            self.waiting[e].clear()
            self.reading[e] = 0
            self.reach_at[e] = None


class InStepReadOrder(VllmReadOrder):
    """A connector that loads in the step that schedules the request (``load_kv_async``
    False: vLLM-Ascend's ``AscendStoreConnector`` and vLLM's ``LMCacheConnectorV1`` under their
    defaults, ``PoolProfile.kv_load``). The scheduler schedules it at once and the worker reads
    its blocks before that step's forward (vLLM ``kv_connector_model_runner_mixin.py``
    ``_get_kv_connector_output``: "Sync loads feed this step's forward so must precede it"), so
    the step, and every request that would start in it or after, waits for the read. Rule: the
    read starts when the scheduler reaches the request, as with ``vllm``, and nothing behind it
    starts until it ends. Not modelled: the running decodes that step holds too (the ``fcfs``
    timing model shares no step between prefill and decode)."""

    lets_pass = False

