"""The operator token a control plane on loopback makes for itself, in a file only its user can
read, where the kvgate CLI of the same user finds it.

Where: `$XDG_RUNTIME_DIR/kvgate/operator-token-<admin port>` (a per-user folder the system
empties at logout), else `~/.config/kvgate/operator-token-<admin port>`. The folder is made
0700 and the file 0600; a folder another user owns or may write into is refused. One file per
admin port, so several control planes on one machine (several `kvgate up`) keep theirs apart.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from kvgate.admin_api.auth import TokenError


def token_folder(environ: Mapping[str, str] = os.environ) -> Path:
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_absolute() and Path(runtime).is_dir():
        return Path(runtime) / "kvgate"
    config = environ.get("XDG_CONFIG_HOME")
    base = Path(config) if config and Path(config).is_absolute() else Path.home() / ".config"
    return base / "kvgate"


def token_path(admin_port: int, environ: Mapping[str, str] = os.environ) -> Path:
    """Where the control plane whose admin API listens on loopback `admin_port` keeps it."""
    return token_folder(environ) / f"operator-token-{admin_port}"


def new_token() -> str:
    return secrets.token_urlsafe(32)


def write_token(path: Path, token: str) -> None:
    """Writes `token` to `path` (0600) in a private folder (0700), replacing any older one."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_private(path.parent)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, f"{token}\n".encode())
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError as exc:
        raise TokenError(f"cannot write the operator token to {path}: {exc.strerror or exc}; "
                         "give the control plane a token instead (KVGATE_ADMIN_TOKEN or "
                         "--admin-token-file)") from None


def read_token(path: Path) -> str | None:
    """The token in `path`, or None if there is none. A file others may read is not trusted:
    whoever could read it may have changed it."""
    try:
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            return None
        return path.read_text().strip() or None
    except OSError:
        return None


def remove_token(path: Path, token: str) -> None:
    """Removes `path` if it still holds `token` (another control plane may have taken the port
    and written its own since)."""
    if read_token(path) == token:
        path.unlink(missing_ok=True)


def _check_private(folder: Path) -> None:
    info = folder.stat()
    if info.st_uid != os.getuid():
        raise TokenError(f"{folder} belongs to another user; the operator token is not written "
                         "there")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise TokenError(f"{folder} may be written by other users (mode "
                         f"{stat.S_IMODE(info.st_mode):o}); make it 0700")
