"""Whether a turn under the skip threshold is cheaper prefilled on a prefill engine, in seconds
(`disaggregation.skip_rule: streams`).

A turn prefilled on its decode engine slows that engine's streams. vLLM's scheduler schedules the
running requests' decode tokens first and fills the rest of the step's `max_num_batched_tokens`
with a waiting request's prefill chunk (`vllm/v1/core/sched/scheduler.py`, `Scheduler.schedule`;
`emulator.steps` and `simulator/itl.py` model it so): every running stream gets its next token
only when the step carrying the chunk ends. A prefill of `lacking` tokens, however it is chunked,
adds its compute, `lacking / prefill_tokens_per_s`, to each running stream's token gaps. That is
what vLLM's decode side pays for recomputing a prompt, the reason its `kv_load_failure_policy`
default became `fail` (vLLM PR #34896, issue #32200).

Disaggregating costs the turn instead (the decode engine computes the lacking tokens either way,
and the prefill engine computes them too, so they cancel):
- the prefill engine's queue (the decider's pick), which hides its read of the prefix from the
  pool while it lasts (vLLM's asynchronous KV connectors; `kvgate.placement.cost`): the larger
  of the two;
- what the decode engine holds and the pool does not, recomputed there: under vLLM-Ascend's
  `MooncakeConnectorV1` + `AscendStoreConnector` only the prefill side writes the pool, and only
  the prompt (vllm-ascend `kv_pool.md` section 2.3.1), so a previous answer is never in it. The
  pool is taken to hold the prompt of the session's last remote turn;
- the decode engine's pull of what it lacks (`get_num_new_matched_tokens`) over the link the
  gate prices (`EngineCost.transfer_s`), and one more step there for the last token (c0).

The two sides are summed seconds of waiting: the streams' stall over every running stream, the
turn's over one. The peers weigh less: Dynamo's conditional disaggregation skips by prompt size
(`isl_bounding`) or by the prefill workers' load (`prefill_load`; DEP #11514, PR #11723); llm-d's
`prefix-based-pd-decider` by the tokens the decode pod lacks alone. Neither prices the decode
engine's streams.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.placement.cost import EngineCost


@dataclass(frozen=True, slots=True)
class SkipPrice:
    cost: EngineCost

    def stall_s(self, running: int, lacking: int) -> float:
        """Seconds the prefill of `lacking` tokens adds to the gaps of `running` streams."""
        return max(0, running) * max(0, lacking) / self.cost.prefill_tokens_per_s

    def remote_s(self, lacking: int, prompt: int, pooled: int, queue_s: float) -> float:
        """Seconds disaggregating adds to the turn's first token: see the module."""
        held = max(0, prompt - lacking)  # what the decode engine holds of the prompt
        pooled = min(max(0, pooled), held)
        cost = self.cost
        return (max(queue_s, cost.transfer_s(pooled))
                + (held - pooled) / cost.prefill_tokens_per_s
                + cost.transfer_s(lacking) + cost.prefill_overhead_s)

    def streams_pay(self, running: int, lacking: int, prompt: int, pooled: int,
                    queue_s: float) -> bool:
        """True: the decode engine's streams lose more than the turn would; disaggregate."""
        return self.stall_s(running, lacking) > self.remote_s(lacking, prompt, pooled, queue_s)
