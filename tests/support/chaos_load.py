"""Busy processes beside a fault run, as `tests/stress.sh` runs the suite: a saturated machine is
where the etcd faults split sessions (issue 41, item 3: 2 of 1,397 sessions at load average ~5),
so the chaos tier makes one itself instead of hoping CI's machine is busy.

``STRESS_BURNERS`` sets how many, as it does for the stress script (0 runs without). By default
two (both cores of the reference machine), or none when the machine is saturated already (its
load average at least twice its cores, as when several suites share it): more would only starve
the run of the traffic it needs to be a test.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

DEFAULT_BURNERS = 2
SATURATED_PER_CORE = 2.0  # load average per core above which the machine is busy enough


def burners_wanted() -> int:
    """``STRESS_BURNERS``, checked (a bad value is an error naming it), or the default above."""
    given = os.environ.get("STRESS_BURNERS")
    if given is None:
        cores = os.cpu_count() or 1
        return 0 if os.getloadavg()[0] >= SATURATED_PER_CORE * cores else DEFAULT_BURNERS
    if not given.isdigit():
        raise ValueError(f"STRESS_BURNERS must be a non-negative integer, got {given!r}")
    return int(given)


@contextmanager
def busy_cores(count: int | None = None) -> Iterator[list[int]]:
    """``count`` (default :func:`burners_wanted`) shell busy loops, pure CPU, one core each, as
    the stress script starts them; their pids while they run; each stopped by its pid at the
    end, however the block ends."""
    wanted = burners_wanted() if count is None else count
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(wanted):
            procs.append(subprocess.Popen(["sh", "-c", "while :; do :; done"],
                                          stdin=subprocess.DEVNULL))
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
        for proc in procs:
            proc.wait()
