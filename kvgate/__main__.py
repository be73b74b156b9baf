import sys

from kvgate.cli import main

sys.exit(main())
