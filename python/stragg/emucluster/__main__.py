"""`python -m stragg.emucluster ...`: the command line (stragg.emucluster.cli)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
