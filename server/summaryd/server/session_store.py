"""The session store: what the daemon remembers about every session across restarts.

For each session id: its run directory, the highest sequence number written for it, whether the client
closed it, and when this was last updated. That is all exactly-once needs: a client (or `summaryd replay`)
that opens a session again learns where to resume, a closed session stays closed, and a session cannot move
to another run. The store is the journal `<state>/sessions` (see `journal`), one line per update; the latest
line of a session wins and sequence numbers only grow. It is rewritten compactly at start-up and when it has
grown to several times the live records, dropping sessions not updated within the retention.

Sequence numbers reach the store when an event file closes (for every session that wrote to it), when a
session is closed or released, and at recovery; while a file is open, its own journal holds them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from summaryd.server.journal import Journal

log = logging.getLogger(__name__)

STORE_NAME = "sessions"
_COMPACT_NAME = "sessions.compact"
_MIN_LINES_BEFORE_COMPACTING = 10_000


@dataclass(slots=True)
class SessionRecord:
    """One session as the store remembers it."""

    session_id: str
    run_dir: str
    last: int
    closed: bool = False
    updated: float = 0.0

    def to_json(self) -> dict[str, object]:
        record: dict[str, object] = {"s": self.session_id, "r": self.run_dir, "q": self.last, "t": int(self.updated)}
        if self.closed:
            record["c"] = 1
        return record

    @classmethod
    def from_json(cls, record: dict[str, object]) -> SessionRecord | None:
        session_id, run_dir, last, updated = record.get("s"), record.get("r"), record.get("q"), record.get("t", 0)
        if not (isinstance(session_id, str) and isinstance(run_dir, str) and isinstance(last, int)):
            return None
        return cls(session_id, run_dir, last, bool(record.get("c")), float(updated) if isinstance(updated, int) else 0)


class SessionStore:
    """Durable session records, kept in memory and in the `sessions` journal of the state directory.

    Thread-safe: the daemon updates it from its I/O threads.
    """

    def __init__(self, state_fd: int, retention_secs: float) -> None:
        self._state_fd = state_fd
        self._retention = retention_secs
        self._lock = threading.Lock()
        self._records: dict[str, SessionRecord] = {}
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_COMPACT_NAME, dir_fd=state_fd)  # left by a crash during compaction: the old store stands
        try:
            self._journal = Journal(STORE_NAME, state_fd, create=False)
        except FileNotFoundError:
            self._journal = Journal(STORE_NAME, state_fd, create=True)
        for line in self._journal.records:
            record = SessionRecord.from_json(line)
            if record is not None:
                self._merge(record)
        self._lines = len(self._journal.records)
        self._journal.records = []

    def __len__(self) -> int:
        return len(self._records)

    def get(self, session_id: str) -> SessionRecord | None:
        with self._lock:
            return self._records.get(session_id)

    def _merge(self, update: SessionRecord) -> SessionRecord:
        known = self._records.get(update.session_id)
        if known is None:
            self._records[update.session_id] = update
            return update
        # Sequence numbers only grow and a closed session stays closed, whatever order updates arrive in.
        known.last = max(known.last, update.last)
        known.closed = known.closed or update.closed
        known.updated = max(known.updated, update.updated)
        known.run_dir = update.run_dir
        return known

    def record(self, updates: Iterable[SessionRecord], *, sync: bool = False) -> None:
        """Remember `updates` durably (in the page cache; with `sync`, on disk). Raises OSError as it was."""
        now = time.time()
        with self._lock:
            lines = []
            for update in updates:
                update.updated = now
                lines.append(self._merge(update).to_json())
            if lines:
                self._journal.append(*lines)
                self._lines += len(lines)
            if sync:
                self._journal.sync()
            if self._lines > max(_MIN_LINES_BEFORE_COMPACTING, 4 * len(self._records)):
                self._compact_locked()

    def sync(self) -> None:
        with self._lock:
            self._journal.sync()

    def compact(self) -> None:
        """Rewrite the store with one line per session, dropping those not updated within the retention."""
        with self._lock:
            self._compact_locked()

    def _compact_locked(self) -> None:
        horizon = time.time() - self._retention
        kept = {sid: r for sid, r in self._records.items() if r.updated >= horizon}
        compact = Journal(_COMPACT_NAME, self._state_fd, create=True)
        try:
            compact.append(*(r.to_json() for r in kept.values()))
            compact.sync()
            # The rename is the commit point: before it the old store stands, after it the compact one.
            os.rename(_COMPACT_NAME, STORE_NAME, src_dir_fd=self._state_fd, dst_dir_fd=self._state_fd)
        except OSError:
            with contextlib.suppress(OSError):
                compact.remove()
            log.exception("compacting the session store failed; keeping the full one")
            return
        os.fsync(self._state_fd)
        self._journal.close()
        self._journal = compact
        compact.name = STORE_NAME
        forgotten = len(self._records) - len(kept)
        if forgotten:
            log.info("session store: forgot %d sessions idle for over %.0f days", forgotten, self._retention / 86400)
        self._records = kept
        self._lines = len(kept)

    def close(self) -> None:
        with self._lock:
            self._journal.close()
