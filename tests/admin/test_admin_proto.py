"""The committed generated modules are exactly what proto/generate.py makes from proto/."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kvgate" / "admin_api" / "v1"


def test_generated_code_matches_proto(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "proto" / "generate.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    fresh = tmp_path / "kvgate" / "admin_api" / "v1"
    generated = sorted(p.name for p in fresh.iterdir())
    assert generated == ["admin_pb2.py", "admin_pb2.pyi", "admin_pb2_grpc.py"]
    for name in generated:
        assert (PACKAGE / name).read_text() == (fresh / name).read_text(), (
            f"kvgate/admin_api/v1/{name} is stale: run `python proto/generate.py` and commit"
        )


def test_generated_imports_resolve_as_a_package() -> None:
    text = (PACKAGE / "admin_pb2_grpc.py").read_text()
    assert "from kvgate.admin_api.v1 import admin_pb2" in text
    assert "from kvgate.admin.v1" not in text  # protoc's own line, rewritten
    spec = importlib.util.find_spec("kvgate.admin_api.v1.admin_pb2_grpc")
    assert spec is not None and spec.origin == str(PACKAGE / "admin_pb2_grpc.py")
