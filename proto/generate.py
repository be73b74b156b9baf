"""Compiles proto/ into the committed Python modules under kvgate/admin_api/v1/.

    python proto/generate.py            # rewrite the committed files
    python proto/generate.py --out DIR  # write them elsewhere (the drift test compares)

protoc names modules after the .proto's path (`kvgate/admin/v1/admin_pb2`), which is where the
descriptor is registered (a unique name in the process-wide pool); the Python package they live in
is `kvgate.admin_api.v1`, so the generated import line is rewritten to match.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
# .proto path under proto/ → Python package (directory) its modules are written to
TARGETS: dict[str, str] = {"kvgate/admin/v1/admin.proto": "kvgate/admin_api/v1"}


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
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
