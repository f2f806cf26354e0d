"""`python -m summaryd.server` runs the `summaryd` command line."""

import sys

from summaryd.server.cli import main

sys.exit(main())
