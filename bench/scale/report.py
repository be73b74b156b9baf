"""The scale benchmark's table: its result JSON as markdown, with targets."""

from __future__ import annotations

from typing import Any


def markdown(r: dict[str, Any]) -> str:
    restart_probe = r["probe"]["replica 1"]["restart of replica 1"]
    three = next(e for e in r["write_economy"] if e["replicas"] == 3)
    one = next(e for e in r["write_economy"] if e["replicas"] == 1)
    rss = r["rss"]
    rows = [
        ("ext_proc RSS per binding, filled live", f"{rss['filled live']['bytes_per_binding']} B",
         "≤ 350 MB at 1M (≤ 350 B)"),
        ("… loaded at a restart (paged)",
         f"{rss['after a restart (paged load)']['bytes_per_binding'][1]} B", ""),
        ("… after a relisting (etcd restarted)",
         f"{rss['after a relisting']['bytes_per_binding']} B", ""),
        ("ext_proc RSS", f"{rss['after a relisting']['rss_mb']} MB", ""),
        ("restarted replica serves / holds every binding",
         f"{r['restart']['serving_after_s']:.1f} s / {r['restart']['holds_all_after_s']:.1f} s",
         "≤ 20 s at 1M"),
        ("probe decisions during that restart: p99, slowest known / new session "
         "(restarted replica; the other one, idle, for the machine's own noise)",
         " and ".join(f"{w['p99_ms']} ms, {w['slowest_known_session_ms']} / "
                      f"{w['slowest_new_session_ms']} ms"
                      for w in (restart_probe, r["probe"]["replica 0"]["restart of replica 1"])),
         "≤ 50 ms"),
        *((f"probe decisions, {name}: p99, slowest known / new session (replica 0 and 1)",
           " and ".join(f"{p['p99_ms']} ms, {p['slowest_known_session_ms']} / "
                        f"{p['slowest_new_session_ms']} ms"
                        for p in (r["probe"][f"replica {i}"][name] for i in (0, 1))),
           "")
          for name in ("watch lag", "failover", "etcd stall", "etcd restart (relist)",
                       "throughout")),
        ("watch lag between replicas p50 / p99",
         f"{r['watch_lag']['p50_ms']:.1f} / {r['watch_lag']['p99_ms']:.1f} ms", "p99 ≤ 100 ms"),
        ("etcd writes per active session per epoch, 1 replica",
         f"{one['writes_per_session_per_epoch']:.2f}", ""),
        ("… with 3 replicas", f"{three['writes_per_session_per_epoch']:.2f}", "≤ 1.1"),
        ("time to leave degraded mode after a "
         f"{r['etcd_stall']['stall_s']:.0f} s etcd stall",
         f"{r['etcd_stall']['degraded_mode_left_after_s']:.2f} s "
         f"({r['etcd_stall']['queued_at_most']} queued)", ""),
        ("batched flush into the local etcd", f"{r['flush']['bindings_per_s']:.0f} bindings/s",
         "≥ 10,000/s"),
        ("kvgate status / endpoints list", f"{r['admin']['status_s']:.2f} s / "
         f"{r['admin']['endpoints_list_s']:.2f} s", "≤ 2 s at 1M"),
        ("failed engine's sessions all moved by the leader",
         f"{r['failover']['engine_sessions_moved_within_s']:.1f} s "
         f"({r['failover']['engine_sessions']:,} sessions)", ""),
        ("all bindings relisted after etcd restarted",
         f"{r['relist']['both_relisted_within_s']:.1f} s", ""),
    ]
    lines = [f"Scale benchmark, {r['bindings']:,} bindings, 2 ext_proc replicas "
             f"(`python -m bench.scale --bindings {r['bindings']}`)", "",
             "| measure | result | target |", "|---|---:|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines) + "\n"
