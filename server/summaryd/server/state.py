"""The daemon's durable state beside the event files, and the recovery that runs before it serves.

Layout of the state directory (`<logdir>/.summaryd` unless `--state-dir` says otherwise; TensorBoard ignores
it, as it holds no `tfevents` file):

    lock              held (flock) by the daemon serving this logdir; a second daemon refuses to start
    sessions          the session store (`session_store`): run, last sequence, closed, per session id
    open/<id>.journal one journal per open event file (`journal.FileJournal`)

Recovery, for each journal left in `open/` (each names an event file that was open when the daemon died):

1. cut the event file back to the last end its journal records; that removes a torn record and whole records
   of a batch that was never journaled, hence never acknowledged (the client resends it). A file with no
   journaled end (the daemon died while creating it) is deleted: it holds a torn `file_version` at most;
2. fsync the file, record every session's last journaled sequence number in the session store, sync it;
3. delete the journal.

Each step is idempotent, so a daemon killed during recovery recovers again at its next start. The recovered
files stay closed: a resumed session writes a new file that sorts last, as every new session does.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from dataclasses import dataclass

from summaryd.server.journal import JOURNAL_SUFFIX, TEMPORARY_SUFFIX, JournaledFile, read
from summaryd.server.session_store import SessionRecord, SessionStore

log = logging.getLogger(__name__)

OPEN_DIR = "open"
# The first component of a run path that names the default state directory; clients may not use it.
RESERVED_RUN = ".summaryd"


class StateLockedError(RuntimeError):
    """Another daemon serves this logdir."""


@dataclass
class RecoveryReport:
    """What start-up recovery found and did."""

    files: int = 0
    """Event files that were open when the previous daemon died."""
    cut_bytes: int = 0
    """Bytes cut from their ends: torn records and batches that were never acknowledged."""
    deleted_files: int = 0
    """Files deleted because not even their `file_version` record was whole."""
    sessions: int = 0
    """Sessions whose sequence numbers were recovered from those files' journals."""


class StateDir:
    """The locked state directory of one daemon: its session store and the journals of its open files."""

    def __init__(self, path: str, retention_secs: float) -> None:
        os.makedirs(os.path.join(path, OPEN_DIR), exist_ok=True)
        self.path = os.path.realpath(path)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._lock_fd = self._lock()
            self.journal_dir_fd = os.open(
                OPEN_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd
            )
            self.store = SessionStore(self.fd, retention_secs)
        except BaseException:
            os.close(self.fd)
            raise

    def _lock(self) -> int:
        fd = os.open("lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644, dir_fd=self.fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StateLockedError(
                    f"another summaryd (pid {holder}) serves this logdir (state directory {self.path}); "
                    "stop it first, or give this daemon another --logdir"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def close(self) -> None:
        """Close the store and release the lock (the daemon is stopping)."""
        self.store.close()
        os.close(self.journal_dir_fd)
        os.close(self._lock_fd)
        os.close(self.fd)

    def recover(self, logdir_fd: int) -> RecoveryReport:
        """Repair the event files the previous daemon left open; see the module docstring."""
        report = RecoveryReport()
        for name in sorted(os.listdir(self.journal_dir_fd)):
            if name.endswith(JOURNAL_SUFFIX):
                self._recover_file(name, logdir_fd, report)
            elif name.endswith(TEMPORARY_SUFFIX):  # a compaction the crash cut short: the journal stands
                os.unlink(name, dir_fd=self.journal_dir_fd)
        self.store.compact()
        return report

    def _recover_file(self, journal_name: str, logdir_fd: int, report: RecoveryReport) -> None:
        journaled = JournaledFile.parse(read(journal_name, self.journal_dir_fd)[0])
        if journaled is not None:
            report.files += 1
            marks = self._repair(journaled, logdir_fd, report)
            records = [SessionRecord(sid, journaled.run_dir, last) for sid, last in marks.items()]
            self.store.record(records, sync=True)
            report.sessions += len(records)
        os.unlink(journal_name, dir_fd=self.journal_dir_fd)
        os.fsync(self.journal_dir_fd)

    def _repair(self, journaled: JournaledFile, logdir_fd: int, report: RecoveryReport) -> dict[str, int]:
        """Cut one event file back to its last journaled end; return each session's last sequence in it."""
        where = f"{journaled.run_dir}/{journaled.file_name}"
        dir_fd = _open_existing_dir(logdir_fd, journaled.run_dir.split("/"))
        if dir_fd is None:
            log.warning("recovery: run directory of %s is gone; keeping its sequence numbers", where)
            return journaled.whole_through(2**63)[1]
        try:
            try:
                fd = os.open(journaled.file_name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except FileNotFoundError:
                log.warning("recovery: %s is gone; keeping its sequence numbers", where)
                return journaled.whole_through(2**63)[1]
            try:
                size = os.fstat(fd).st_size
                cut, marks = journaled.whole_through(size)
                if cut < 0:
                    os.unlink(journaled.file_name, dir_fd=dir_fd)
                    report.deleted_files += 1
                    log.warning("recovery: deleted %s (%d bytes, not even its header was whole)", where, size)
                    return marks
                if size > cut:
                    os.ftruncate(fd, cut)
                    report.cut_bytes += size - cut
                    log.warning(
                        "recovery: cut %d bytes (a torn or unacknowledged batch) from the end of %s", size - cut, where
                    )
                os.fsync(fd)
                return marks
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)


def _open_existing_dir(logdir_fd: int, parts: list[str]) -> int | None:
    """Open the run directory `parts` below the logdir without creating or following anything; None if absent."""
    fd = os.dup(logdir_fd)
    try:
        for part in parts:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                    os.close(fd)
                    return None
                raise
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
