"""Compiles proto/ into the committed Python modules under kvgate/admin_api/v1/.

    python proto/generate.py            # rewrite the committed files
    python proto/generate.py --out DIR  # write them elsewhere (the drift test compares)

protoc names modules after the .proto's path (`kvgate/admin/v1/admin_pb2`), which is where the
descriptor is registered (a unique name in the process-wide pool); the Python package they live in
is `kvgate.admin_api.v1`, so the generated import line is rewritten to match.

The output embeds the generator's version (GRPC_GENERATED_VERSION, the protobuf gencode version),
which is why grpcio-tools is pinned in pyproject.toml's `test` extra and the committed files are
only rewritten by that version; `comparable` leaves those stamps out for drift checks.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
# .proto path under proto/ → Python package (directory) its modules are written to
TARGETS: dict[str, str] = {"kvgate/admin/v1/admin.proto": "kvgate/admin_api/v1"}

# Where the generated text names the generator's version; `comparable` blanks them.
_STAMPS = (
    (re.compile(r"^GRPC_GENERATED_VERSION = '[^']*'$", re.M),
     "GRPC_GENERATED_VERSION = '<grpcio-tools>'"),
    (re.compile(r"^# Protobuf Python Version: .*$", re.M), "# Protobuf Python Version: <protoc>"),
    (re.compile(r"(ValidateProtobufRuntimeVersion\(\n\s*_runtime_version\.Domain\.\w+,)"
                r"\s*\d+,\s*\d+,\s*\d+,\s*'[^']*',"), r"\1 <protoc>,"),
)


def comparable(text: str) -> str:
    """Generated text without the generator's version stamps: what a drift check compares."""
    for pattern, replacement in _STAMPS:
        text = pattern.sub(replacement, text)
    return text


def pinned_grpcio_tools() -> str:
    """The grpcio-tools version pyproject.toml pins (the one the committed files come from)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for requirement in extras["test"]:
        name, sep, version = requirement.partition("==")
        if name.strip() == "grpcio-tools" and sep:
            return version.strip()
    raise LookupError("pyproject.toml: no grpcio-tools==VERSION in the test extra")


def check_generator(writing_committed_files: bool) -> str | None:
    """Why this environment cannot generate (None when it can)."""
    pinned = pinned_grpcio_tools()
    try:
        found = importlib.util.find_spec("grpc_tools") is not None
    except ImportError:
        found = False
    if not found:
        return (f"proto/generate.py needs grpcio-tools=={pinned} (in the test extra): "
                f"pip install -e '.[test]'")
    installed = metadata.version("grpcio-tools")
    if writing_committed_files and installed != pinned:
        return (f"grpcio-tools {installed} is installed but the committed stubs come from "
                f"{pinned} (pinned in pyproject.toml): pip install 'grpcio-tools=={pinned}', or "
                f"raise the pin and the grpcio/protobuf lower bounds together")
    return None


def generate(out_root: Path) -> list[Path]:
    """Writes every target's modules under `out_root` (the repository root by default)."""
    written: list[Path] = []
    for proto, package_dir in TARGETS.items():
        with tempfile.TemporaryDirectory() as raw:
            tmp = Path(raw)
            subprocess.run(
                [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}",
                 f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", proto],
                check=True, cwd=PROTO_ROOT,
            )
            stem = proto.removesuffix(".proto")
            generated_module = stem.replace("/", ".")  # kvgate.admin.v1.admin
            target_package = package_dir.replace("/", ".")
            dest = out_root / package_dir
            dest.mkdir(parents=True, exist_ok=True)
            for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
                source = tmp / f"{stem}{suffix}"
                text = source.read_text()
                package, _, name = generated_module.rpartition(".")
                text = text.replace(f"from {package} import {name}_pb2",
                                    f"from {target_package} import {name}_pb2")
                path = dest / source.name
                path.write_text(text)
                written.append(path)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write under")
    args = parser.parse_args()
    problem = check_generator(writing_committed_files=args.out.resolve() == ROOT)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
