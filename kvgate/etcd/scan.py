"""Reading a large prefix in time linear in its keys.

etcd (3.5) counts, for every Range it answers, all the keys from the request's start to its
range end, whatever its limit: paging through a million keys a thousand at a time visits ~500
million keys (measured here: 0.7 s per page at the start of a million, 6 minutes for the whole
listing). So a large prefix is read in windows: its children (`{prefix}{child}/`, say the
pools under `bindings/`), each cut by the characters of what follows (sessions are UUIDs) into
windows of at most a few pages, each window paged on its own: every key is visited a few times
(once per level of cutting) instead of once per page. The windows cover the whole key space,
all at one revision.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from itertools import pairwise

from kvgate.etcd.client import EtcdClient, KeyValue, prefix_end

ALPHABET = "-0123456789abcdef"  # what canonical UUIDs are made of, in byte order
WINDOW_PAGES = 4  # a window holds this many pages at most
MAX_KEY_DEPTH = 512  # keys are never cut deeper (bytes)


async def scan(
    client: EtcdClient, prefix: bytes, page_size: int | None = None
) -> AsyncIterator[tuple[list[KeyValue], int]]:
    """Every key under `prefix`, in pages, each with the revision they were all read at."""
    size = page_size or client.page_size
    total, revision = await client.count_range(prefix, prefix_end(prefix))
    if total <= WINDOW_PAGES * size:
        async for page in _window(client, prefix, prefix_end(prefix), size, revision):
            yield page
        return
    end = prefix_end(prefix)
    first, _, _ = await client.range_page(prefix, end, 1, revision)
    if first and b"/" not in first[0].key[len(prefix):]:  # its keys are the sessions: cut it
        async for page in _child(client, prefix, size, revision):
            yield page
        return
    start = prefix
    while start < end:
        first, _, _ = await client.range_page(start, end, 1, revision)
        if not first:
            return
        rest = first[0].key[len(prefix):]
        slash = rest.find(b"/")
        if slash < 0:  # a key right under the prefix among children: read it, go on after it
            yield first, revision
            start = first[0].key + b"\0"
            continue
        child = prefix + rest[:slash + 1]
        async for page in _child(client, child, size, revision):
            yield page
        start = prefix_end(child)


async def _child(
    client: EtcdClient, child: bytes, size: int, revision: int
) -> AsyncIterator[tuple[list[KeyValue], int]]:
    async for page in _split(client, child, prefix_end(child), size, revision):
        yield page


async def _split(
    client: EtcdClient, low: bytes, high: bytes, size: int, revision: int
) -> AsyncIterator[tuple[list[KeyValue], int]]:
    """[low, high) paged if it holds a few pages at most, else cut after `low` by the next
    character (`-`, then hex: a UUID's alphabet) and each part read the same way. Time-ordered
    UUIDs, which share their first characters, are cut deeper; the part before `low + "-"`
    (keys with other characters there: rare) is paged as it is."""
    count, _ = await client.count_range(low, high, revision)
    if count <= WINDOW_PAGES * size or len(low) >= MAX_KEY_DEPTH:
        async for page in _window(client, low, high, size, revision):
            yield page
        return
    bounds = [low, *(low + c.encode() for c in ALPHABET), high]
    async for page in _window(client, bounds[0], bounds[1], size, revision):
        yield page
    for part_low, part_high in pairwise(bounds[1:]):
        async for page in _split(client, part_low, part_high, size, revision):
            yield page


async def _window(
    client: EtcdClient, low: bytes, high: bytes, size: int, revision: int
) -> AsyncIterator[tuple[list[KeyValue], int]]:
    key = low
    while True:
        kvs, more, _ = await client.range_page(key, high, size, revision)
        if kvs:
            yield kvs, revision
        if not more or not kvs:
            return
        key = kvs[-1].key + b"\0"
