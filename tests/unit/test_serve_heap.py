"""A service started by its command (kvgate.runtime.tasks.serve) keeps what start-up made out
of the garbage collector's full passes (gc.freeze): one over a started ext_proc's objects took
120-140 ms of its event loop on a busy machine. In a child process: freezing is for the whole
process."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import asyncio, gc, os, signal
from kvgate.runtime.tasks.serve import serve_until_signalled

class Service:
    async def start(self):
        self.made = [[i] for i in range(1000)]  # start-up's objects
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)

    async def stop(self, grace=5.0):
        print(gc.get_freeze_count() >= 1000)

print(asyncio.run(serve_until_signalled(Service(), "test")))
"""


def test_what_start_up_made_is_frozen_before_serving() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.stdout.split() == ["True", "0"], (done.stdout, done.stderr)
