"""A state file replaced whole: written to a temporary file beside it, fsynced, renamed over it, the directory
fsynced, so a crash leaves the old file or the new one, never part of one."""

from __future__ import annotations

import os
from collections.abc import Iterable


def replace_state_file(path: str, chunks: Iterable[bytes]) -> None:
    """Make `path` hold `chunks`, joined (blocking)."""
    temporary = path + ".tmp"
    with open(temporary, "wb") as file:
        for chunk in chunks:
            file.write(chunk)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
