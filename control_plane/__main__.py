import sys

from kvgate.cli import main

sys.exit(main(["control-plane", *sys.argv[1:]]))
