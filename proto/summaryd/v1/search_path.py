"""Keeps a folder named `summaryd` in the working directory from standing in for this package.

`summaryd` is a namespace package (the client, the daemon and the wire contract are portions of it), so any
directory of that name on `sys.path` becomes a portion too. `python -m` puts the working directory first on
`sys.path` (so does `''` or `.` on `PYTHONPATH`); run from the parent of a clone, its `summaryd/client` and
`summaryd/server` folders (holding the sources one level down, no `__init__.py`) then resolve as namespace
packages ahead of the installed ones (an editable install's finder is asked only after the path's), their
`__init__` never runs, and their modules load in an order they were not written for: a circular ImportError.
Every entry point calls `unshadow()` before it imports the rest of the package.
"""

from __future__ import annotations

import os
import sys

# What a directory named `summaryd` holds when it is a portion of this package.
_PORTIONS = ("cli", "client", "server", "v1")


def _foreign(directory: str) -> bool:
    if not os.path.isdir(directory):
        return False
    return not any(os.path.isfile(os.path.join(directory, part, "__init__.py")) for part in _PORTIONS)


def unshadow() -> None:
    """Drop the working directory from `sys.path` when a `summaryd` folder there is not a portion of this
    package, and forget the namespace packages imported from it, so that they are imported again from the
    installation."""
    cwd = os.getcwd()
    if not _foreign(os.path.join(cwd, "summaryd")):
        return
    shadowing = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) == cwd]
    if not shadowing:
        return
    sys.path[:] = [entry for entry in sys.path if entry not in shadowing]
    for name in [name for name in sys.modules if name == "summaryd" or name.startswith("summaryd.")]:
        if getattr(sys.modules[name], "__file__", None) is None:  # a namespace package, perhaps the folder's
            del sys.modules[name]
