"""`python -m shigoto.cli`: the console script without an installed entry point."""

import sys

from shigoto.cli.commands import main

sys.exit(main())
