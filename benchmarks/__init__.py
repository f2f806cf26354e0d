"""The benchmarks (`python benchmarks/run.py`, see README.md here).

They start the daemon, SeaweedFS and TensorBoard with the tests' launchers (`tests/_daemon.py`, `_seaweed.py`,
`_tensorboard.py`: one launcher of each, with the test support); this puts `tests/` on the path for every way
in — the suite, `python -m benchmarks.board`, the trial processes, a test importing a benchmark.
"""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent.parent / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)  # last: the launchers' names shadow nothing
