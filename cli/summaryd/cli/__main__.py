"""`python -m summaryd.cli` runs the `summaryd` command line."""

import sys

from summaryd.v1.search_path import unshadow

unshadow()  # `-m` put the working directory first on sys.path

from summaryd.cli import main  # noqa: E402 - after the path is mended

sys.exit(main())
