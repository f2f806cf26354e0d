"""Put on a child's `PYTHONPATH` by `summaryd run`: Python imports it at start-up, before the program.

It patches `torch.utils.tensorboard` and `tensorboardX` (`summaryd.client.patch()`), then runs the
`sitecustomize` this one shadows, if there is one further down the path, as the auto-instrumentation tools do.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    ours = sys.modules["sitecustomize"]
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules["sitecustomize"] = ours


def _patch() -> None:
    path = list(sys.path)
    try:
        from summaryd.v1.search_path import unshadow

        unshadow()  # `''` or `.` on PYTHONPATH: a `summaryd` folder in the working directory is not ours
        from summaryd.client import patch
    except ImportError as exc:  # a child run with another Python, one without summaryd
        print(f"summaryd run: not patching {sys.executable}: {exc}", file=sys.stderr)
        return
    finally:
        sys.path[:] = path  # the program's own imports still find what its path gives them
    patch()


_patch()
_chain()
