"""The cyclic garbage collector, paused for batch work that makes millions of small objects.

Workloads, their block hashes and a simulation's state are built of containers that hold no
reference cycles worth finding: the collector would only rescan them, again and again as they grow
(a third of a fleet-scale simulation's time). Reference counting still frees them.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused(*, freeze: bool = False) -> Iterator[None]:
    """Pause the collector for the block (as it was after). ``freeze``: what the block made lives
    for the rest of the process, so move it out of the collector's sight for good."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if collecting:
            gc.enable()
