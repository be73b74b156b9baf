"""`kvgate up --kv-events-port P` with emulated engines: engine i publishes its KV cache events
on P + i (as `kvgate emulate` numbers them), so the collector must read each engine's own
stream, not every engine at P. The engines are put on consecutive ports B, B+1, ... and the
collector told `kv_events_port_offset: P - B` (an engine's events at its own port plus that).
Each engine also serves vLLM's replay socket, on R + i (`kv_events_replay_offset: R - P`): a
gap in a stream is filled from it, and a control plane started again (kvgate up restarts it)
catches up on each engine's recent past instead of knowing nothing of conversations under way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvgate.config import Config
from kvgate.runtime.children.ports import free_run
from stack.local import config_ports


@dataclass(frozen=True, slots=True)
class EventPorts:
    """Where the emulated engines go, for their KV events to be read one stream each."""

    engine_port: int  # the first engine's; the others on the next ports
    replay_port: int  # the first engine's replay socket; the others on the next ports


def event_ports(config: Config, events_port: int, engines: int) -> EventPorts:
    """`engines` consecutive free ports for the engines, right after the events' ports if those
    are free, and as many for the replay sockets (the stack's own ports and the events' left
    out)."""
    taken = {*config_ports(config), *range(events_port, events_port + engines)}
    engine_port = free_run(engines, exclude=taken, first=events_port + engines)
    taken |= set(range(engine_port, engine_port + engines))
    return EventPorts(engine_port, free_run(engines, exclude=taken,
                                            first=engine_port + engines))


def with_event_streams(config: Config, events_port: int,
                       ports: EventPorts) -> tuple[Config, str]:
    """`config` whose collector reads each engine's own stream (`source: collector` only: the
    events have no other reader), and a line saying how they are wired."""
    gate = config.placement.load_gate
    offset = events_port - ports.engine_port
    if gate.feed != "collector":
        return config, (f"  KV events: engine i publishes on {events_port}+i; nothing reads "
                        "them (placement.load_gate.source: collector does)")
    wired = gate.events_at_offsets(offset, ports.replay_port - events_port)
    config = replace(config, placement=replace(config.placement, load_gate=wired))
    note = (" (the YAML's kv_events_port would read every engine at one port: replaced)"
            if gate.kv_event_ports[0] else "")
    return config, (f"  KV events: engine i publishes on {events_port}+i, read by the "
                    f"collector (kv_events_port_offset {offset}, replay on "
                    f"{ports.replay_port}+i){note}")
