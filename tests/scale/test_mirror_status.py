"""A mirror that cannot resume is never shown as synced: its state and real reason are in the
log, in the metrics of its replica and in `kvgate status`, and it keeps retrying. An ext_proc
whose largest accepted reply is smaller than one page of bindings stands in for any such trouble
(before paging, that was every replica past ~28,000 bindings)."""

from __future__ import annotations

import json
from pathlib import Path

from structlog.testing import capture_logs

from ext_proc.service import ExtProcOptions, ExtProcService
from kvgate.config.model import HostPort
from kvgate.etcd import EtcdClient
from tests.admin.admin_helpers import run_cli
from tests.failsafe.failsafe_helpers import (
    control_plane_config,
    running_control_plane,
    write_config,
)
from tests.scale.scale_helpers import A, B, bind, sessions
from tests.support.polling import eventually


async def test_a_replica_that_cannot_list_its_bindings_says_so_everywhere(
    etcd, prefix: str, tmp_path: Path
) -> None:
    config = control_plane_config([A, B], etcd.endpoint, prefix)
    writer = EtcdClient([etcd.endpoint])
    await bind(writer, prefix, sessions(500))  # a page of them: ~75 KB
    service = ExtProcService(config, ExtProcOptions(
        listen=HostPort("127.0.0.1", 0), metrics=None, etcd_endpoints=(etcd.endpoint,),
        identity="ext-proc-under-test", etcd_max_message_bytes=16 * 1024))
    admin = str(config.control_plane.admin)
    async with running_control_plane(config, write_config(tmp_path / "kvgate.yaml", config)):
        try:
            with capture_logs() as logs:
                await service.start()
            unsynced = next(e for e in logs if e["event"] == "bindings_start_unsynced")
            assert unsynced["kind"] == "too_large" and "larger than max" in unsynced["reason"]
            lost = next(e for e in logs if e["event"] == "etcd_mirror_lost")
            assert lost["mirror"] == "bindings" and lost["kind"] == "too_large"

            registry = service.metrics.registry

            def synced(mirror: str) -> float | None:
                return registry.get_sample_value(
                    "kvgate_etcd_mirror_synced", {"service": "ext_proc", "mirror": mirror})

            assert synced("bindings") == 0 and synced("endpoints") == 1

            async def reported() -> bool:
                result = await run_cli("status", "--json", admin=admin)
                return any(m["replica"] == "ext_proc ext-proc-under-test"
                           for m in json.loads(result.out)["mirrors"])

            await eventually(reported, within=15)
            status = json.loads((await run_cli("status", "--json", admin=admin)).out)
            mirrors = {(m["replica"].split()[0], m["name"]): m for m in status["mirrors"]}
            stale = mirrors[("ext_proc", "bindings")]
            assert stale["state"] == "stale" and "too_large" in stale["error"]
            assert mirrors[("ext_proc", "endpoints")]["state"] == "synced"
            assert mirrors[("control_plane", "endpoints")]["state"] == "synced"
            assert mirrors[("control_plane", "membership")]["state"] == "synced"
            [replica] = status["ext_procs"]
            assert replica["identity"] == "ext-proc-under-test" and replica["bindings"] == 0
            text = (await run_cli("status", admin=admin)).out
            row = next(line for line in text.splitlines()
                       if "ext-proc-under-test" in line and "bindings" in line)
            assert "STALE" in row and "too_large" in row

            def too_large() -> float:
                return registry.get_sample_value(
                    "kvgate_etcd_errors_total", {"service": "ext_proc", "kind": "too_large"}) or 0

            seen = too_large()
            await eventually(lambda: too_large() > seen, within=15)  # still retrying
            assert synced("bindings") == 0
        finally:
            await service.stop(grace=0)
            await writer.close()
