"""A config file's text, read with bounds: a size cap (so /dev/zero is an error, not a hang) and
a deadline for pipes and FIFOs nobody writes to."""

from __future__ import annotations

import os
import select
import stat
import time
from pathlib import Path

from kvgate.config.errors import ConfigError, Problem

MAX_BYTES = 1 << 20  # 1 MiB: real configs are a few KiB
READ_WAIT = 10.0  # seconds a pipe or FIFO may take to deliver the whole file


def read_text(path: str | Path, *, limit: int = MAX_BYTES, wait: float = READ_WAIT) -> str:
    """The UTF-8 text at `path`, or a ConfigError naming why it cannot be used."""
    source = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _unreadable(source, exc.strerror or str(exc)) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise _unreadable(source, "it is a directory")
        if stat.S_ISREG(mode) and os.fstat(fd).st_size > limit:
            raise _too_large(source, limit)
        data = _read_bounded(fd, limit, wait, fifo=stat.S_ISFIFO(mode), source=source)
    except OSError as exc:
        raise _unreadable(source, exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise _too_large(source, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            [Problem((), f"not UTF-8 text (byte 0x{data[exc.start]:02x})", line)], source
        ) from None


def _read_bounded(fd: int, limit: int, wait: float, *, fifo: bool, source: str) -> bytes:
    """Reads until end of file or `limit` + 1 bytes. A FIFO no writer has opened yet reads as
    end of file at once, so for a FIFO an empty read only counts once a writer was seen."""
    deadline = time.monotonic() + wait
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    chunks: list[bytes] = []
    size = 0
    writer_seen = not fifo
    while size <= limit:
        try:
            chunk: bytes | None = os.read(fd, min(1 << 16, limit + 1 - size))
        except BlockingIOError:
            chunk = None
        if chunk:
            chunks.append(chunk)
            size += len(chunk)
            writer_seen = True
            continue
        if chunk == b"" and writer_seen:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ConfigError([Problem(
                (), f"the file did not end within {wait:g}s (a pipe, FIFO or terminal that "
                "nobody finished writing to?)",
            )], source)
        for _, events in poller.poll(remaining * 1000):
            if events & (select.POLLHUP | select.POLLIN):
                writer_seen = True  # data, or a writer that came and went: end of file is real
    return b"".join(chunks)


def _unreadable(source: str, reason: str) -> ConfigError:
    return ConfigError([Problem((), f"cannot read the file: {reason}")], source)


def _too_large(source: str, limit: int) -> ConfigError:
    return ConfigError([Problem(
        (), f"the file is larger than {limit // 1024} KiB; a kvgate config is a few KiB "
        "(is this the right file?)",
    )], source)
