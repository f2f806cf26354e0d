"""Run the summaryd benchmarks side by side with their peers: `python benchmarks/run.py [--quick]`.

See benchmarks/README.md for what is measured and how to read the tables.
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    # Run as a script, Python puts benchmarks/ on the path; the modules import as `benchmarks.*` from the root.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
    from benchmarks.suite import main

    sys.exit(main())
