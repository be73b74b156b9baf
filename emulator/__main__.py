"""``python -m emulator``: same as ``kvgate emulate``."""

from __future__ import annotations

import argparse
import sys

from emulator.command import add_arguments, run


def main() -> int:
    """Parse arguments and run."""
    parser = argparse.ArgumentParser(prog="python -m emulator", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
