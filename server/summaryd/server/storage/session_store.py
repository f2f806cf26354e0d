"""The session store: what the daemon remembers about every session across restarts.

For each session id: its run directory, the highest sequence number written for it, whether the client
closed it, and when this was last updated. That is all exactly-once needs: a client (or `summaryd replay`)
that opens a session again learns where to resume, a closed session stays closed, and a session cannot move
to another run. The store is the journal `<state>/sessions` (see `journal`), one line per update; the latest
line of a session wins and sequence numbers only grow. It is rewritten compactly at start-up and when it has
grown to several times the live records, dropping sessions not updated within the retention.

Sequence numbers reach the store when an event file closes (for every session that wrote to it), when a
session is closed or released, and at recovery; while a file is open, its own journal holds them.

A damaged store (a line failing its checksum, garbage, not a file at all) is kept aside by the state directory
(`state.StateDir.quarantine`) and rewritten from its good lines. A session whose last good line comes before
the damage may have lost a later update (a higher sequence number, its close): it is kept as `doubtful`, and
resuming it is refused, as is resuming a session the store does not know that started before `lost_before`.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from summaryd.server.storage.journal import Journal

# Keeps a damaged state file aside: (directory fd, name, what is wrong, copy (True) or move (False)).
Quarantine = Callable[[int, str, str, bool], None]
# A state entry that is not a regular file (a directory, a symlink) cannot be opened as one.
NOT_A_FILE_ERRNOS = frozenset({errno.EISDIR, errno.ENOTDIR, errno.ELOOP, errno.ENXIO})

log = logging.getLogger("summaryd.server.session_store")  # the name log lines carry, kept across moves

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
    doubtful: bool = False
    """A later update of this session may have been lost with damaged state: `last` may be too low."""

    def to_json(self) -> dict[str, object]:
        record: dict[str, object] = {"s": self.session_id, "r": self.run_dir, "q": self.last, "t": int(self.updated)}
        if self.closed:
            record["c"] = 1
        if self.doubtful:
            record["d"] = 1
        return record

    @classmethod
    def from_json(cls, record: dict[str, object]) -> SessionRecord | None:
        session_id, run_dir, last, updated = record.get("s"), record.get("r"), record.get("q"), record.get("t", 0)
        if not (isinstance(session_id, str) and isinstance(run_dir, str) and isinstance(last, int)):
            return None
        return cls(
            session_id,
            run_dir,
            last,
            bool(record.get("c")),
            float(updated) if isinstance(updated, int) else 0,
            bool(record.get("d")),
        )


class SessionStore:
    """Durable session records, kept in memory and in the `sessions` journal of the state directory.

    Thread-safe: the daemon updates it from its I/O threads.
    """

    def __init__(
        self,
        state_fd: int,
        retention_secs: float,
        quarantine: Quarantine | None = None,
        *,
        expected_size: int = 0,
        witness: Callable[[int], None] | None = None,
    ) -> None:
        """Load the store of the state directory `state_fd`; damage is handed to `quarantine` (None: raise).

        `witness` is told the store's size after every update, and `expected_size` is what it was last told
        (kept outside the store, so that a store cut short is told from one whose last append was torn).
        """
        self._state_fd = state_fd
        self._witness = witness
        self._retention = retention_secs
        self._lock = threading.Lock()
        self._records: dict[str, SessionRecord] = {}
        self.lost_before: float | None = None
        """Set by the state directory: state was lost that sessions started before this time may have had."""
        try:
            os.unlink(_COMPACT_NAME, dir_fd=state_fd)  # left by a crash during compaction: the old store stands
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno not in NOT_A_FILE_ERRNOS or quarantine is None:
                raise
            quarantine(state_fd, _COMPACT_NAME, "is not a file", False)
        self._journal = self._open(quarantine)
        scan = self._journal.scan
        last_line: dict[str, int] = {}
        for index, line in enumerate(scan.records):
            record = SessionRecord.from_json(line)
            if record is not None:
                self._merge(record)
                last_line[record.session_id] = index
        for session_id, index in last_line.items():
            # A session last heard of before the damage may have lost a later line in it (not its close:
            # a closed session stays closed).
            record = self._records[session_id]
            record.doubtful = record.doubtful or (index < scan.trusted_from and not record.closed)
        self._lines = len(scan.records)
        damage = scan.describe()
        self._journal.drop_scan()  # loaded: its records need not stay in memory
        # (A store kept aside whole, being no file at all, has been reported already.)
        short = not self._replaced and os.fstat(self._journal.fileno()).st_size < expected_size
        if scan.damaged or short:
            what = damage if scan.damaged else f"is shorter than the {expected_size} bytes last written"
            if quarantine is None:
                self._journal.close()
                raise OSError(f"the session store {STORE_NAME} is damaged: {what}")
            quarantine(state_fd, STORE_NAME, what, True)
            # Rewritten from its good lines now, so that the damage is reported once (the copy keeps it).
            if not self._compact_locked(horizon=0.0):
                raise OSError(f"the session store {STORE_NAME} could not be rewritten after damage")
        else:
            if scan.torn:
                log.debug("session store: cut a torn last line (%d bytes) left by a crash", scan.torn)
            self._journal.cut_torn()
            self._witnessed()

    def _open(self, quarantine: Quarantine | None) -> Journal:
        self._replaced = False
        try:
            journal = Journal(STORE_NAME, self._state_fd, create=False)
        except FileNotFoundError:
            return Journal(STORE_NAME, self._state_fd, create=True)
        except OSError as exc:
            if exc.errno not in NOT_A_FILE_ERRNOS or quarantine is None:
                raise
            quarantine(self._state_fd, STORE_NAME, "is not a file", False)
            self._replaced = True
            return Journal(STORE_NAME, self._state_fd, create=True)
        return journal

    def lost_state_before(self, when: float | None) -> None:
        """State that sessions started before `when` (Unix seconds; None: never) may have had was lost."""
        self.lost_before = when

    def may_have_lost(self, next_sequence: int, session_started: float) -> bool:
        """Whether a session the store does not know may be one whose record was lost with damaged state.

        It may when state was lost and the client has seen events of the session acknowledged (it resumes at
        `next_sequence` > 1) or says it started the session (`session_started`, Unix seconds, 0: not said)
        before the damaged state was last written.
        """
        lost_before = self.lost_before
        if lost_before is None:
            return False
        return next_sequence > 1 or 0 < session_started <= lost_before

    def __len__(self) -> int:
        return len(self._records)

    def get(self, session_id: str) -> SessionRecord | None:
        with self._lock:
            return self._records.get(session_id)

    def last_of_run(self, run_dir: str) -> dict[str, int]:
        """The last sequence number of each session recorded on `run_dir` (those that wrote anything)."""
        with self._lock:
            return {r.session_id: r.last for r in self._records.values() if r.run_dir == run_dir and r.last > 0}

    def _merge(self, update: SessionRecord) -> SessionRecord:
        known = self._records.get(update.session_id)
        if known is None:
            self._records[update.session_id] = update
            return update
        # Sequence numbers only grow and a closed session stays closed, whatever order updates arrive in.
        known.last = max(known.last, update.last)
        known.closed = known.closed or update.closed
        known.updated = max(known.updated, update.updated)
        known.doubtful = known.doubtful or update.doubtful
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
                self._witnessed()
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

    def _compact_locked(self, horizon: float | None = None) -> bool:
        """Rewrite the store (keeping sessions updated after `horizon`, default: within the retention); False
        when that failed and the full store was kept."""
        if horizon is None:
            horizon = time.time() - self._retention
        kept = {sid: r for sid, r in self._records.items() if r.updated >= horizon}
        try:
            # The rename is the commit point: before it the old store stands, after it the compact one.
            compact = Journal.replace(
                STORE_NAME, self._state_fd, (r.to_json() for r in kept.values()), temporary=_COMPACT_NAME
            )
        except OSError:
            log.exception("compacting the session store failed; keeping the full one")
            return False
        self._journal.close()
        self._journal = compact
        forgotten = len(self._records) - len(kept)
        if forgotten:
            log.info("session store: forgot %d sessions idle for over %.0f days", forgotten, self._retention / 86400)
        self._records = kept
        self._lines = len(kept)
        self._witnessed()
        return True

    def _witnessed(self) -> None:
        if self._witness is not None:
            self._witness(self._journal.size)

    def close(self) -> None:
        with self._lock:
            self._journal.close()
