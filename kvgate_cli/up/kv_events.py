"""`kvgate up --kv-events-port P` with emulated engines: engine i publishes its KV cache events
on P + i (as `kvgate emulate` numbers them), so the collector must read each engine's own
stream, not every engine at P. The engines are put on consecutive ports B, B+1, ... and the
collector told `kv_events_port_offset: P - B` (an engine's events at its own port plus that).
"""

from __future__ import annotations

from dataclasses import replace

from kvgate.config import Config
from kvgate.runtime.children.ports import free_run
from stack.local import config_ports


def engine_ports_for_events(config: Config, events_port: int, engines: int) -> int:
    """The first emulated engine's port: `engines` consecutive free ports, right after the
    events' ports if those are free (the stack's own ports and the events' left out)."""
    events = range(events_port, events_port + engines)
    return free_run(engines, exclude={*config_ports(config), *events},
                    first=events_port + engines)


def with_event_streams(config: Config, events_port: int, engine_port: int) -> tuple[Config, str]:
    """`config` whose collector reads each engine's own stream (`source: collector` only: the
    events have no other reader), and a line saying how they are wired."""
    gate = config.placement.load_gate
    offset = events_port - engine_port
    if not (gate.enabled and gate.source == "collector"):
        return config, (f"  KV events: engine i publishes on {events_port}+i; nothing reads "
                        "them (placement.load_gate.source: collector does)")
    wired = replace(gate, kv_events_port=0, kv_events_port_offset=offset)
    config = replace(config, placement=replace(config.placement, load_gate=wired))
    note = (" (the YAML's kv_events_port would read every engine at one port: replaced)"
            if gate.kv_events_port else "")
    return config, (f"  KV events: engine i publishes on {events_port}+i, read by the "
                    f"collector (kv_events_port_offset {offset}){note}")
