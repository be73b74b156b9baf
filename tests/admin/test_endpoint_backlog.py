"""`kvgate endpoints list` shows the load gate's backlog estimate per engine: the largest any
live ext_proc replica reports (a stale report is left out)."""

from __future__ import annotations

import json
import time

from kvgate.replicas import REPORT_TTL, ReplicaReport, ReportPublisher
from tests.admin.admin_helpers import Fleet, StartServer, run_cli


async def test_endpoints_list_shows_the_replicas_backlog_estimates(
        fleet: Fleet, admin_server: StartServer) -> None:
    now = time.time()
    reports = (
        ReplicaReport("a", now, backlog={"10.0.0.11:8000": 1.5, "10.0.0.12:8000": 0.0}),
        ReplicaReport("b", now, backlog={"10.0.0.11:8000": 2.25}),
        ReplicaReport("stale", now - REPORT_TTL - 5, backlog={"10.0.0.12:8000": 99.0}),
    )
    for report in reports:
        await ReportPublisher(fleet.client, fleet.prefix, report.identity,
                              lambda report=report: report).publish()
    # Older reports without the field still read (replicas of the previous version).
    old = json.loads(ReplicaReport("old", now).encode())
    del old["backlog"]
    assert ReplicaReport.decode(json.dumps(old).encode()).backlog == {}

    server = await admin_server()
    admin = f"127.0.0.1:{server.port}"
    listed = await run_cli("endpoints", "list", "--json", admin=admin)
    assert listed.code == 0, listed.err
    backlog = {e["address"]: e["load"]["backlog_s"] for e in json.loads(listed.out)}
    assert backlog == {"10.0.0.11:8000": 2.25, "10.0.0.12:8000": 0.0,
                       "10.0.0.13:8000": None, "10.0.1.1:8000": None,
                       "10.0.1.2:8000": None}
    table = await run_cli("endpoints", "list", admin=admin)
    assert "BACKLOG" in table.out
    row = next(line for line in table.out.splitlines() if "10.0.0.11:8000" in line)
    assert "2.25s" in row.split(), row
