"""``python -m emulator``: same as ``kvgate emulate``."""

import sys

from emulator.command import add_arguments, run
from kvgate.runtime.tasks.entry import run_alone

if __name__ == "__main__":
    sys.exit(run_alone("python -m emulator", __doc__, add_arguments, run))
