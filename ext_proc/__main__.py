"""``python -m ext_proc``: same as ``kvgate ext-proc``."""

from __future__ import annotations

import argparse
import sys

from ext_proc.command import add_arguments, run


def main() -> int:
    """Parse arguments and run (without the `kvgate` command table: the app layer sits above)."""
    parser = argparse.ArgumentParser(prog="python -m ext_proc", description=__doc__)
    add_arguments(parser)
    try:
        return run(parser.parse_args())
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
