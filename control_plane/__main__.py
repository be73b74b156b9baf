"""``python -m control_plane``: same as ``kvgate control-plane``."""

import sys

from control_plane.command import add_arguments, run
from kvgate.runtime.tasks.entry import run_alone

if __name__ == "__main__":
    sys.exit(run_alone("python -m control_plane", __doc__, add_arguments, run))
