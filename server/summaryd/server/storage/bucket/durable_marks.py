"""The durable watermark of each session of a bucket logdir: which of its sequence numbers are uploaded.

After each batch the session's events end at a known place in the run's staged file (file name, size). Once
the shipper has uploaded a file up to there, everything up to that batch's last sequence number is in the
bucket. Staged file names sort in the order they were made, so an upload of a later file covers every mark in
an earlier one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class _Marks:
    run_dir: str
    durable: int
    pending: deque[tuple[str, int, int]] = field(default_factory=deque)  # (file name, size, last sequence)


class DurableMarks:
    """Per session: where its batches end in staging, and the highest sequence number uploaded."""

    def __init__(self) -> None:
        self._sessions: dict[str, _Marks] = {}

    def durable(self, session_id: str) -> int:
        """The highest sequence number of the session known to be in the bucket (0: none, or not tracked)."""
        marks = self._sessions.get(session_id)
        return marks.durable if marks is not None else 0

    def start(self, session_id: str, run_dir: str, durable: int) -> None:
        """Track a session (new or resumed) whose first `durable` sequence numbers are in the bucket."""
        known = self._sessions.get(session_id)
        self._sessions[session_id] = _Marks(run_dir, max(durable, known.durable if known else 0))

    def staged(self, session_id: str, name: str, size: int, last: int) -> None:
        """The session's events up to `last` are in the staged file `name`, which is `size` bytes long now."""
        marks = self._sessions.get(session_id)
        if marks is not None and last > marks.durable:
            marks.pending.append((name, size, last))

    def uploaded(self, run_dir: str, name: str, end: int) -> list[tuple[str, int]]:
        """The staged file `name` of `run_dir` is uploaded up to `end`: the sessions whose watermark moved, and
        where it stands now."""
        moved: list[tuple[str, int]] = []
        for session_id, marks in self._sessions.items():
            if marks.run_dir != run_dir:
                continue
            before = marks.durable
            while marks.pending and (marks.pending[0][0], marks.pending[0][1]) <= (name, end):
                marks.durable = max(marks.durable, marks.pending.popleft()[2])
            if marks.durable > before:
                moved.append((session_id, marks.durable))
        return moved

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
