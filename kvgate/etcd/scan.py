"""Reading a large prefix in time linear in its keys.

etcd (3.5) counts, for every Range it answers, all the keys from the request's start to its
range end, whatever its limit: paging through a million keys a thousand at a time visits ~500
million keys (measured here: 0.7 s per page at the start of a million, 6 minutes for the whole
listing). So a large prefix is read in windows: its children (`{prefix}{child}/`, say the
pools under `bindings/`), each cut by the characters of what follows (sessions are UUIDs) into
windows of at most a few pages, each window paged on its own: every key is visited a few times
(once per level of cutting) instead of once per page. The windows cover the whole key space,
all at one revision, and PARALLEL of them are read at once (etcd answers one while the caller
applies another).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from itertools import pairwise
from typing import Any

from kvgate.etcd.client import EtcdClient, KeyValue, prefix_end

ALPHABET = "-0123456789abcdef"  # what canonical UUIDs are made of, in byte order
WINDOW_PAGES = 4  # a window holds this many pages at most
MAX_KEY_DEPTH = 512  # keys are never cut deeper (bytes)
PARALLEL = 4  # windows read at once

Page = tuple[list[KeyValue], int]


async def scan(
    client: EtcdClient, prefix: bytes, page_size: int | None = None
) -> AsyncIterator[Page]:
    """Every key under `prefix`, in pages (in key order within a window, windows in no set
    order), each with the revision they were all read at."""
    size = page_size or client.page_size
    end = prefix_end(prefix)
    total, revision = await client.count_range(prefix, end)
    if total <= WINDOW_PAGES * size:
        async for page in window(client, prefix, end, size, revision):
            yield page
        return
    pages: asyncio.Queue[Page | None] = asyncio.Queue(maxsize=2 * PARALLEL)
    windows: asyncio.Queue[tuple[bytes, bytes] | None] = asyncio.Queue(maxsize=4 * PARALLEL)

    async def cut() -> None:
        async for window in _windows(client, prefix, size, revision):
            await windows.put(window)
        for _ in range(PARALLEL):
            await windows.put(None)

    async def read() -> None:
        while (span := await windows.get()) is not None:
            async for page in window(client, *span, size, revision):
                await pages.put(page)
        await pages.put(None)

    tasks = [asyncio.ensure_future(cut()), *(asyncio.ensure_future(read())
                                             for _ in range(PARALLEL))]
    try:
        done = 0
        while done < PARALLEL:
            got = await _next(pages, tasks)
            if got is None:
                done += 1
            else:
                yield got
        await asyncio.gather(*tasks)  # raises what a task met
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.gather(*tasks, return_exceptions=True)


async def _next(
    pages: asyncio.Queue[Page | None], tasks: Sequence[asyncio.Future[None]]
) -> Page | None:
    """The next page, or the first failure of a task (an etcd error stops the whole scan)."""
    getting = asyncio.ensure_future(pages.get())
    while True:
        failed = next((e for t in tasks if t.done() and (e := t.exception()) is not None), None)
        if failed is not None:
            getting.cancel()
            raise failed
        waiting: set[asyncio.Future[Any]] = {getting, *(t for t in tasks if not t.done())}
        finished, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if getting in finished:
            return getting.result()


async def _windows(
    client: EtcdClient, prefix: bytes, size: int, revision: int
) -> AsyncIterator[tuple[bytes, bytes]]:
    """Windows covering [prefix, prefix_end(prefix)): per child, cut by _split."""
    end = prefix_end(prefix)
    first, _, _ = await client.range_page(prefix, end, 1, revision)
    if first and b"/" not in first[0].key[len(prefix):]:  # its keys are the sessions: cut it
        async for window in _split(client, prefix, end, size, revision):
            yield window
        return
    start = prefix
    while start < end:
        first, _, _ = await client.range_page(start, end, 1, revision)
        if not first:
            return
        rest = first[0].key[len(prefix):]
        slash = rest.find(b"/")
        if slash < 0:  # a key right under the prefix among children: read it, go on after it
            yield start, first[0].key + b"\0"
            start = first[0].key + b"\0"
            continue
        child = prefix + rest[:slash + 1]
        async for window in _split(client, child, prefix_end(child), size, revision):
            yield window
        start = prefix_end(child)


async def _split(
    client: EtcdClient, low: bytes, high: bytes, size: int, revision: int
) -> AsyncIterator[tuple[bytes, bytes]]:
    """[low, high) whole if it holds a few pages at most, else cut after `low` by the next
    character (`-`, then hex: a UUID's alphabet) and each part cut the same way. Time-ordered
    UUIDs, which share their first characters, are cut deeper; the part before `low + "-"`
    (keys with other characters there: rare) stays whole."""
    count, _ = await client.count_range(low, high, revision)
    if count <= WINDOW_PAGES * size or len(low) >= MAX_KEY_DEPTH:
        yield low, high
        return
    bounds = [low, *(low + c.encode() for c in ALPHABET), high]
    yield bounds[0], bounds[1]
    for part_low, part_high in pairwise(bounds[1:]):
        async for window in _split(client, part_low, part_high, size, revision):
            yield window


def fixed_windows(base: bytes, depth: int = 2) -> list[tuple[bytes, bytes]]:
    """[base, prefix_end(base)) cut by the first `depth` characters after `base` (of
    ALPHABET, in order): for reading a little of a large prefix in key order from some key on,
    each Range counting only its window's keys (~1/289 of a prefix of UUIDs)."""
    cuts = [b""]
    for _ in range(depth):
        cuts = [cut + ch.encode() for cut in cuts for ch in ALPHABET]
    return list(pairwise([base, *(base + cut for cut in cuts), prefix_end(base)]))


async def window(
    client: EtcdClient, low: bytes, high: bytes, size: int, revision: int = 0
) -> AsyncIterator[Page]:
    """[low, high) in pages of `size`, in key order."""
    key = low
    while True:
        kvs, more, _ = await client.range_page(key, high, size, revision)
        if kvs:
            yield kvs, revision
        if not more or not kvs:
            return
        key = kvs[-1].key + b"\0"
