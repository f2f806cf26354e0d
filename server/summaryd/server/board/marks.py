"""How far into an event file the board index has taken its records (`saved`, `BoardIndex.marked`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

TAIL_BYTES = 4
"""Bytes of a file kept with its mark: the CRC of the record that ends there."""


@dataclass(frozen=True)
class FileMark:
    """How far into an event file a run's points go: `offset` bytes, the last `TAIL_BYTES` of them `tail`."""

    name: str
    offset: int
    tail: bytes

    @classmethod
    def of(cls, path: str, offset: int) -> FileMark | None:
        """The mark of `path` at `offset` (None: the file cannot be read there)."""
        tail = b""
        if offset:
            try:
                with open(path, "rb") as f:
                    f.seek(offset - TAIL_BYTES)
                    tail = f.read(TAIL_BYTES)
            except OSError:
                return None
            if len(tail) != TAIL_BYTES:
                return None
        return cls(os.path.basename(path), offset, tail)

    def holds(self, path: str) -> bool:
        """Whether `path` still has this file's bytes up to the mark (it may have grown since)."""
        if os.path.basename(path) != self.name:
            return False
        again = FileMark.of(path, self.offset)
        return again is not None and again.tail == self.tail
