"""Admin API answers as plain dicts (for --json) and as aligned tables (for people)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.contract.states import EndpointState


def _opt(message: Any, name: str) -> Any:
    """An optional proto field as None when unset (JSON null), so scripts see every key."""
    return getattr(message, name) if message.HasField(name) else None


def endpoint_dict(e: pb.Endpoint) -> dict[str, Any]:
    return {
        "pool": e.pool, "address": e.address, "kv_pool": e.kv_pool, "weight": e.weight,
        "role": e.role or "both", "state": e.state, "admin": e.admin, "healthy": e.healthy,
        "drain_deadline": _opt(e, "drain_deadline"), "source": e.source or "static",
        "left_at": _opt(e, "left_at"),
    }


def endpoint_status_dict(s: pb.EndpointStatus) -> dict[str, Any]:
    load = {n: _opt(s.load, n)
            for n in ("running", "waiting", "kv_cache_usage", "hit_rate", "backlog_s")}
    return {**endpoint_dict(s.endpoint), "sessions": s.sessions, "load": load,
            "held": s.held or None}


def binding_dict(b: pb.SessionBinding) -> dict[str, Any]:
    return {"session": b.session, "pool": b.pool, "endpoint": b.endpoint,
            "revision": b.revision, "lease": b.lease, "moved_at": _opt(b, "moved_at"),
            "move_reason": b.move_reason or None, "move_terms": dict(b.move_terms) or None,
            "stay_s": _opt(b, "stay_s"),
            "last_turn": None if not b.HasField("last_turn") else {
                "path": b.last_turn.path, "decode": b.last_turn.decode,
                "prefill": b.last_turn.prefill or None,
                "lacking_tokens": b.last_turn.lacking_tokens, "at": b.last_turn.at}}


def status_dict(s: pb.StatusResponse) -> dict[str, Any]:
    nodes = [{
        "node_id": n.node_id, "cluster": n.cluster, "connected_at": n.connected_at,
        "acked": dict(sorted(n.acked.items())), "nacks": n.nacks,
        "last_nack": _opt(n, "last_nack"), "last_nack_version": _opt(n, "last_nack_version"),
    } for n in s.nodes]
    return {
        "identity": s.identity, "leader": _opt(s, "leader"),
        "config_version": s.config_version, "config_source": s.config_source,
        "last_reload_error": _opt(s, "last_reload_error"), "nodes": nodes,
        "endpoints": [endpoint_status_dict(e) for e in s.endpoints],
        "endpoints_error": _opt(s, "endpoints_error"),
        "failing_tasks": [{"task": t.task, "restarts": t.restarts, "error": t.error,
                           "failed_at": t.failed_at} for t in s.failing_tasks],
        "etcd_errors": [{"kind": e.kind, "count": e.count, "error": e.error,
                         "last_at": e.last_at} for e in s.etcd_errors],
        "etcd_alarms": list(s.etcd_alarms),
        "membership_generation": s.membership_generation,
        "membership_warning": _opt(s, "membership_warning"),
        "mirrors": [mirror_dict(m) for m in s.mirrors],
        "ext_procs": [{"identity": e.identity, "reported_at": e.reported_at,
                       "bindings": e.bindings, "pending": e.pending, "degraded": e.degraded,
                       "unbound": e.unbound, "load_source": e.load_source or None,
                       "load_age_s": _opt(e, "load_age_s"),
                       "collector_reachable": e.collector_reachable} for e in s.ext_procs],
        "fleet_collector": None if not s.HasField("fleet_collector") else {
            "collecting": s.fleet_collector.collecting, "engines": s.fleet_collector.engines,
            "watchers": s.fleet_collector.watchers, "interval_s": s.fleet_collector.interval_s,
            "rounds": s.fleet_collector.rounds},
        "etcd_db_bytes": _opt(s, "etcd_db_bytes"),
        "etcd_db_in_use_bytes": _opt(s, "etcd_db_in_use_bytes"),
        "sessions_note": _opt(s, "sessions_note"),
        "discovery": [{"pool": d.pool, "source": d.source, "engines": d.engines,
                       "age_s": _opt(d, "age_seconds"), "error": d.error or None}
                      for d in s.discovery],
    }


def mirror_dict(m: pb.MirrorStatus) -> dict[str, Any]:
    return {"replica": m.replica, "name": m.name, "state": m.state, "since": m.since,
            "revision": m.revision, "relists": m.relists, "error": _opt(m, "error")}


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=False)


# -- text ----------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = [headers, *rows]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def duration(seconds: float) -> str:
    """Like the YAML's durations: 9m59s, 2h5m, 45s."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "",
             f"{secs}s" if secs or not (hours or minutes) else ""]
    return "".join(parts)


def moment(unix: float, now: float | None = None) -> str:
    """A unix time as UTC plus how far away it is: `18:50:00Z (in 9m59s)`."""
    now = time.time() if now is None else now
    stamp = datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    delta = unix - now
    relative = f"in {duration(delta)}" if delta >= 0 else f"{duration(-delta)} ago"
    return f"{stamp} ({relative})"


def _number(value: float | None, percent: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value * 100:.1f}%" if percent else f"{value:g}"


def endpoints_table(found: Sequence[pb.EndpointStatus]) -> str:
    if not found:
        return "no endpoints"
    rows = []
    for s in found:
        e = s.endpoint
        note = f"deadline {moment(e.drain_deadline)}" if e.HasField("drain_deadline") else ""
        if e.HasField("left_at"):
            note = f"left {e.source} {moment(e.left_at)}, {note or 'draining'}"
        if e.state == EndpointState.FAILED and e.admin != EndpointState.FAILED:
            note = "failing health checks"
        elif s.held:
            note = f"FAILING PROBES, still routed to: {s.held}"
        elif not e.healthy and e.state != EndpointState.FAILED:
            note = "failing probes"
        rows.append([
            e.pool, e.address, e.kv_pool, e.role or "both", e.state, str(s.sessions),
            _number(_opt(s.load, "running")), _number(_opt(s.load, "waiting")),
            _number(_opt(s.load, "kv_cache_usage"), percent=True),
            _number(_opt(s.load, "hit_rate"), percent=True), _seconds(_opt(s.load, "backlog_s")),
            e.source or "static", note,
        ])
    return table(["POOL", "ENDPOINT", "KV_POOL", "ROLE", "STATE", "SESSIONS", "RUNNING",
                  "WAITING", "KV_USAGE", "HIT_RATE", "BACKLOG", "SOURCE", "NOTE"], rows)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def endpoint_line(e: pb.Endpoint) -> str:
    text = f"{e.pool} {e.address}: {e.state}"
    if e.state != e.admin:
        text += f" (operator set {e.admin})"
    if e.HasField("drain_deadline"):
        text += f", sessions move at {moment(e.drain_deadline)}"
    elif e.state == EndpointState.DRAINING:
        text += ", sessions stay until idle"
    return text


def sessions_table(found: Sequence[pb.SessionBinding]) -> str:
    if not found:
        return "no sessions"
    rows = [[b.pool, b.session, b.endpoint, str(b.revision), str(b.lease),
             f"{b.move_reason}, {moment(b.moved_at)}{_estimate(b)}" if b.move_reason else "-"]
            for b in found]
    return table(["POOL", "SESSION", "ENDPOINT", "REVISION", "LEASE", "LAST MOVED"], rows)


def turn_lines(found: Sequence[pb.SessionBinding]) -> list[str]:
    """Prefill/decode pools: how each session's latest turn was prefilled."""
    lines = []
    for b in found:
        if not b.HasField("last_turn"):
            continue
        t = b.last_turn
        lacked = f"its decode engine lacked ~{t.lacking_tokens} tokens"
        if t.path == "remote":
            how = f"prefilled on {t.prefill}, decoded on {t.decode} ({lacked})"
        elif t.path == "prefill_failed":
            how = f"prefill on {t.prefill} failed: prefilled and decoded on {t.decode}"
        else:
            how = f"no prefill engine ({t.path}: {lacked}), prefilled and decoded on {t.decode}"
        lines.append(f"{b.pool} {b.session} last turn {moment(t.at)}: {how}")
    return lines


def _estimate(b: pb.SessionBinding) -> str:
    """A load gate's move: its estimate there, per term, against staying's."""
    if not b.move_terms:
        return ""
    terms = " + ".join(f"{name} {seconds:.2f}s" for name, seconds in sorted(b.move_terms.items()))
    stay = f" vs {b.stay_s:.2f}s staying" if b.HasField("stay_s") else ""
    return f" ({terms}{stay})"


def _mebibytes(value: int) -> str:
    return f"{value / 1048576:.1f} MiB"


def mirrors_table(s: pb.StatusResponse) -> str:
    """Every etcd mirror of this control plane and of each reporting ext_proc replica."""
    rows = []
    for m in s.mirrors:
        note = m.error if m.HasField("error") else ""
        if m.relists:
            note = f"relisted {m.relists}×" + (f"; {note}" if note else "")
        rows.append([m.replica, m.name, m.state.upper() if m.state != "synced" else m.state,
                     moment(m.since), str(m.revision), note])
    return table(["MIRROR OF", "PREFIX", "STATE", "SINCE", "REVISION", "NOTE"], rows)


def ext_procs_table(s: pb.StatusResponse) -> str:
    if not s.ext_procs:
        return "no ext_proc replica reporting (each reports every 5 s while it reaches etcd)"
    rows = [[e.identity, moment(e.reported_at), str(e.bindings), str(e.pending),
             "DEGRADED" if e.degraded else "-", str(e.unbound), engine_load(e)]
            for e in s.ext_procs]
    return table(["EXT_PROC", "REPORTED", "BINDINGS", "PENDING", "ETCD WRITES", "UNBOUND",
                  "ENGINE LOAD"], rows)


def engine_load(e: pb.ExtProcStatus) -> str:
    """Where a replica's load gate gets the engines' load, and whether it still does."""
    if e.load_source != "collector":
        return e.load_source or "- (gate off)"
    age = "no figure yet" if not e.HasField("load_age_s") else f"newest {e.load_age_s:.2f}s old"
    if e.collector_reachable:
        return f"collector ({age})"
    return f"COLLECTOR UNREACHABLE ({age}): static stickiness"


def collector_line(s: pb.StatusResponse) -> str | None:
    """The fleet-state collector of the answering replica, when the gate uses one."""
    if not s.HasField("fleet_collector"):
        return None
    c = s.fleet_collector
    if not c.collecting:
        return "fleet state    collector: not collecting here (only the leader collects)"
    return (f"fleet state    collector: {c.engines} engines every {c.interval_s * 1000:g}ms, "
            f"{c.watchers} ext_proc streams, {c.rounds} rounds")


def discovery_lines(s: pb.StatusResponse) -> list[str]:
    """Each discovery source: its engines and how old its last good answer is."""
    lines = []
    for d in s.discovery:
        age = (f"last answer {duration(d.age_seconds)} ago" if d.HasField("age_seconds")
               else "no answer yet")
        line = f"discovery      {d.pool} {d.source}: {d.engines} engines, {age}"
        if d.error:
            line += f"; FAILING (the last set stands): {d.error}"
        lines.append(line)
    return lines


def _trouble_lines(s: pb.StatusResponse) -> list[str]:
    """etcd alarms, etcd errors by kind and failing background tasks: nothing when all is well."""
    lines = [f"etcd alarm     {alarm}: etcd refuses writes until it is disarmed "
             "(docs/operating.md, etcd out of space)" for alarm in s.etcd_alarms]
    lines.extend(f"etcd errors    {e.kind} ×{e.count}, last {moment(e.last_at)}: {e.error}"
                 for e in s.etcd_errors)
    lines.extend(f"task failing   {t.task}: restarted {t.restarts}×, last {moment(t.failed_at)}: "
                 f"{t.error}" for t in s.failing_tasks)
    return lines


def status_text(s: pb.StatusResponse) -> str:
    leader = s.leader if s.HasField("leader") else "none elected"
    lines = [
        f"control plane  {s.identity}" + ("  (leader)" if s.leader == s.identity else ""),
        f"leader         {leader}",
        f"config         {s.config_source} version {s.config_version}",
    ]
    if s.HasField("last_reload_error"):
        lines.append(f"last reload    FAILED: {s.last_reload_error}")
    lines.append(f"membership     generation {s.membership_generation or '-'}")
    if s.HasField("membership_warning"):
        lines.append(f"               WARNING: {s.membership_warning}")
    if s.HasField("etcd_db_bytes"):
        lines.append(f"etcd database  {_mebibytes(s.etcd_db_bytes)} "
                     f"({_mebibytes(s.etcd_db_in_use_bytes)} in use)")
    collector = collector_line(s)
    if collector is not None:
        lines.append(collector)
    lines.extend(discovery_lines(s))
    lines.extend(_trouble_lines(s))
    lines.append("")
    lines.append(mirrors_table(s))
    lines.append("")
    lines.append(ext_procs_table(s))
    lines.append("")
    if s.nodes:
        rows = []
        for n in s.nodes:
            acked = ", ".join(f"{t.rsplit('.', 1)[-1]}={v}" for t, v in sorted(n.acked.items()))
            nack = "-"
            if n.nacks:
                nack = f"{n.nacks}× last {n.last_nack_version or '?'}: {n.last_nack or ''}"
            rows.append([n.node_id, n.cluster, moment(n.connected_at), acked or "-", nack])
        lines.append(table(["ENVOY NODE", "CLUSTER", "CONNECTED", "ACKED", "NACKS"], rows))
    else:
        lines.append("no Envoy connected to this replica")
    lines.append("")
    if s.HasField("endpoints_error"):
        lines.append(f"endpoints: {s.endpoints_error}")
    else:
        lines.append(endpoints_table(s.endpoints))
        if s.HasField("sessions_note"):
            lines.append(f"sessions: {s.sessions_note}")
    return "\n".join(lines)
