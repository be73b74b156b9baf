"""``python -m control_plane``: same as ``kvgate control-plane``."""

from __future__ import annotations

import argparse
import sys

from control_plane.command import add_arguments, run


def main() -> int:
    """Parse arguments and run (without the `kvgate` command table: the app layer sits above)."""
    parser = argparse.ArgumentParser(prog="python -m control_plane", description=__doc__)
    add_arguments(parser)
    try:
        return run(parser.parse_args())
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
