"""``python -m kvgate_cli``: the ``kvgate`` command."""

import sys

from kvgate_cli.main import main

sys.exit(main())
