"""`python -m stragg` is `python -m stragg.info`: what a bug report needs."""

import sys

from .info import main

sys.exit(main())
