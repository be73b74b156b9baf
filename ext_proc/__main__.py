"""``python -m ext_proc``: same as ``kvgate ext-proc``."""

import sys

from ext_proc.command import add_arguments, run
from kvgate.runtime.tasks.entry import run_alone

if __name__ == "__main__":
    sys.exit(run_alone("python -m ext_proc", __doc__, add_arguments, run))
