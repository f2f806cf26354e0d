"""Full (generation 2) garbage collections seen while a benchmark runs: how many, and the longest.

A full collection stops whichever thread triggered it (and, holding the GIL, every other thread) for a time
that grows with the heap; it is what the slowest calls of every contender are made of.
"""

from __future__ import annotations

import gc
import time
from types import TracebackType
from typing import Any


class FullCollections:
    """Context manager that counts full collections, and times the longest and all of them together."""

    def __init__(self) -> None:
        self.count = 0
        self.longest_ns = 0
        self.total_ns = 0
        self._started = 0

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter_ns()
        else:
            took = time.perf_counter_ns() - self._started
            self.count += 1
            self.longest_ns = max(self.longest_ns, took)
            self.total_ns += took

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        gc.callbacks.remove(self._on_gc)
