"""`python -m summaryd.server` runs the `summaryd` command line (`summaryd.cli`), as it always has.

The one module of the daemon's package that imports from above it: a program, which nothing imports.
"""

import sys

from summaryd.v1.search_path import unshadow

unshadow()  # `-m` put the working directory first on sys.path

from summaryd.cli import main  # noqa: E402 - after the path is mended

sys.exit(main())
