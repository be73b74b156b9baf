"""Where each engine came from and how old each source's answer is, as the admin API carries
them and `kvgate endpoints list` / `kvgate status` print them."""

from __future__ import annotations

from control_plane.admin.servicer import control_plane_status, endpoint
from control_plane.discovery import SourceView
from control_plane.status import ControlPlaneStatus
from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.contract.states import EndpointState
from kvgate.endpoints import EndpointRecord
from kvgate_cli.admin import render


def test_endpoints_say_their_source_and_when_they_left() -> None:
    static = EndpointRecord("coder", "10.0.0.1:8000", "kv-a")
    leaving = EndpointRecord("coder", "10.0.0.2:8000", "kv-a", admin=EndpointState.DRAINING,
                             drain_deadline=2e9, source="dns", left_at=2e9 - 300)
    rows = [pb.EndpointStatus(endpoint=endpoint(r)) for r in (static, leaving)]
    text = render.endpoints_table(rows).splitlines()
    assert text[0].split()[-2:] == ["SOURCE", "NOTE"]
    assert "static" in text[1] and " dns " in text[2] and "left dns" in text[2]
    assert render.endpoint_dict(rows[1].endpoint)["source"] == "dns"
    assert render.endpoint_dict(rows[0].endpoint)["left_at"] is None


def test_status_shows_each_sources_age_and_failure() -> None:
    status = ControlPlaneStatus("cp-1", "cp-1", "v1", "kvgate.yaml", discovery=(
        SourceView("coder", "dns", 3, 65.0, "engines.svc A: Timeout"),
        SourceView("coder", "etcd", 2, 0.4, ""),
        SourceView("batch", "dns", 0, None, "")))
    message = control_plane_status(status)
    lines = [line for line in render.status_text(message).splitlines()
             if line.startswith("discovery")]
    assert lines == [
        "discovery      coder dns: 3 engines, last answer 1m5s ago; FAILING (the last set "
        "stands): engines.svc A: Timeout",
        "discovery      coder etcd: 2 engines, last answer 0s ago",
        "discovery      batch dns: 0 engines, no answer yet",
    ]
    as_json = render.status_dict(message)["discovery"]
    assert as_json[0] == {"pool": "coder", "source": "dns", "engines": 3, "age_s": 65.0,
                          "error": "engines.svc A: Timeout"}
    assert as_json[2]["age_s"] is None
