"""The committed generated modules are exactly what proto/generate.py makes from proto/, apart
from the generator's version stamps (a drift check must not turn red on a grpcio-tools release)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.support.missing import run_without

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kvgate" / "admin_api" / "v1"


def _generate_module() -> ModuleType:  # proto/generate.py is a script: load it by path
    spec = importlib.util.spec_from_file_location("kvgate_proto_generate",
                                                  ROOT / "proto" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _generate_module()


def test_generated_code_matches_proto(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "proto" / "generate.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    fresh = tmp_path / "kvgate" / "admin_api" / "v1"
    generated = sorted(p.name for p in fresh.iterdir())
    assert generated == ["admin_pb2.py", "admin_pb2.pyi", "admin_pb2_grpc.py"]
    for name in generated:
        committed = generate.comparable((PACKAGE / name).read_text())
        assert committed == generate.comparable((fresh / name).read_text()), (
            f"kvgate/admin_api/v1/{name} is stale: run `python proto/generate.py` and commit"
        )


def test_generated_imports_resolve_as_a_package() -> None:
    text = (PACKAGE / "admin_pb2_grpc.py").read_text()
    assert "from kvgate.admin_api.v1 import admin_pb2" in text
    assert "from kvgate.admin.v1" not in text  # protoc's own line, rewritten
    spec = importlib.util.find_spec("kvgate.admin_api.v1.admin_pb2_grpc")
    assert spec is not None and spec.origin == str(PACKAGE / "admin_pb2_grpc.py")


def test_drift_check_ignores_only_the_generators_version() -> None:
    stub = (PACKAGE / "admin_pb2_grpc.py").read_text()
    messages = (PACKAGE / "admin_pb2.py").read_text()
    assert "GRPC_GENERATED_VERSION = '" in stub
    assert "# Protobuf Python Version: " in messages
    other_release = (
        stub.replace("GRPC_GENERATED_VERSION = '", "GRPC_GENERATED_VERSION = '9.99.0-")
    )
    assert other_release != stub
    assert generate.comparable(other_release) == generate.comparable(stub)
    other_protoc = messages.replace("# Protobuf Python Version: ", "# Protobuf Python Version: 9")
    for number in ("    7,\n", "    35,\n", "    1,\n"):  # the gencode version, one per line
        assert number in other_protoc
        other_protoc = other_protoc.replace(number, "    9,\n", 1)
    assert generate.comparable(other_protoc) == generate.comparable(messages)
    # a real change to the API still shows
    renamed = messages.replace("ListEndpoints", "ListEngines")
    assert generate.comparable(renamed) != generate.comparable(messages)


def test_generate_without_grpcio_tools_names_the_extra(tmp_path: Path) -> None:
    body = (f"import runpy\nsys.argv = ['generate.py', '--out', {str(tmp_path)!r}]\n"
            f"runpy.run_path({str(ROOT / 'proto' / 'generate.py')!r}, run_name='__main__')\n")
    result = run_without({"grpc_tools"}, body, ROOT)
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"proto/generate.py needs grpcio-tools=={generate.pinned_grpcio_tools()} "
        "(in the test extra): pip install -e '.[test]'"
    ), result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []
