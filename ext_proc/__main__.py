import sys

from kvgate.cli import main

sys.exit(main(["ext-proc", *sys.argv[1:]]))
