"""The daemon's durable state beside the event files, and the recovery that runs before it serves.

Layout of the state directory (`<logdir>/.summaryd` unless `--state-dir` says otherwise; TensorBoard ignores
it, as it holds no `tfevents` file):

    lock              held (flock) by the daemon serving this logdir; a second daemon refuses to start. It
                      holds the daemon's pid and the session store's size after its last update: a store
                      found shorter was cut short (damage), not torn by a crash
    sessions          the session store (`session_store`): run, last sequence, closed, per session id
    open/<id>.journal one journal per open event file (`journal.FileJournal`)
    losses            when state was found damaged, and where it was kept (a journal like the others)
    damaged-<time>-*  damaged state, kept aside as found (never read again, never rewritten)

Recovery, for each journal left in `open/` (each names an event file that was open when the daemon died):

1. cut the event file back to the last end its journal records; that removes a torn record and whole records
   of a batch that was never journaled, hence never acknowledged (the client resends it). A file with no
   journaled end (the daemon died while creating it) is deleted: it holds a torn `file_version` at most;
2. fsync the file, record every session's last journaled sequence number in the session store, sync it;
3. delete the journal.

Each step is idempotent, so a daemon killed during recovery recovers again at its next start. The recovered
files stay closed: a resumed session writes a new file that sorts last, as every new session does.

State is trusted no further than its checksums and its confinement: a damaged state file (a line failing its
checksum, garbage, a directory or symlink where a file belongs, a journal naming a run outside the logdir) is
logged as an error, kept aside as `damaged-*`, and what is still good in it is used. Before anything is moved,
`losses` durably records the damaged file's modification time: no session record lost in it can be younger,
so the session store refuses to resume an unknown session that started before it (`SessionStore.lost_before`)
instead of writing its events twice.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import stat
import time
from dataclasses import dataclass
from typing import Any

from summaryd.server.errors import RunPathError
from summaryd.server.storage.journal import JOURNAL_SUFFIX, TEMPORARY_SUFFIX, Journal, JournaledFile, Scan, read
from summaryd.server.storage.runpath import DirIdentity, allow, dir_identity, forbid, open_existing_dir, validate_run
from summaryd.server.storage.session_store import NOT_A_FILE_ERRNOS, STORE_NAME, SessionRecord, SessionStore
from summaryd.v1.runpath import RESERVED_RUN

log = logging.getLogger("summaryd.server.state")  # the name log lines carry, kept across moves

OPEN_DIR = "open"
LOSSES_NAME = "losses"
DAMAGED_PREFIX = "damaged-"


class StateError(RuntimeError):
    """The state directory cannot be used; the message says what to do."""


class StateLockedError(StateError):
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
    damaged: int = 0
    """State files found damaged and kept aside (see `StateDir.quarantine`), at start-up and in recovery."""


class StateDir:
    """The locked state directory of one daemon: its session store and the journals of its open files."""

    def __init__(self, path: str, retention_secs: float) -> None:
        """Take the lock, keep damaged state aside, load the store.

        Raises:
            StateError: the state directory cannot be used (not a directory, `lock` not a file, another daemon
                holds it); the message says what to do.
        """
        self.damaged = 0
        self.lost_before: float | None = None
        """State was lost that sessions started before this time (Unix seconds) may have had; None: never."""
        self._store: SessionStore | None = None
        self._losses: Journal | None = None
        try:
            os.makedirs(path, exist_ok=True)
            self.path = os.path.realpath(path)
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise StateError(
                f"state directory {path}: {exc.strerror}; give --state-dir (or --logdir) a directory summaryd can "
                "create and write"
            ) from None
        self._lock_fd = -1
        try:
            self.identity: DirIdentity = dir_identity(self.fd)
            self._lock_fd, store_size = self._lock()
            forbid(self.identity)
            self._losses = self._open_losses()
            self.journal_dir_fd = self._open_journal_dir()
            if store_size and not _exists(self.fd, STORE_NAME):
                self._record_loss(STORE_NAME, f"is missing ({store_size} bytes last written)", time.time(), "")
            self.store = self._store = SessionStore(
                self.fd, retention_secs, self.quarantine, expected_size=store_size, witness=self._witness
            )
            self.store.lost_state_before(self.lost_before)
        except BaseException as exc:
            allow(self.identity)
            if self._losses is not None:
                self._losses.close()
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
            os.close(self.fd)
            if isinstance(exc, OSError):  # unreadable or unwritable state: one line, not a traceback
                raise StateError(f"state directory {self.path}: {exc}; the daemon needs to read and write it") from None
            raise

    def _lock(self) -> tuple[int, int]:
        """Take the lock; return its descriptor and the store size it witnessed (0: none)."""
        try:
            fd = os.open("lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno not in NOT_A_FILE_ERRNOS:
                raise
            # Not taken over: a daemon may still hold the lock file this entry replaced.
            raise StateError(
                f"state directory {self.path}: 'lock' is not a regular file; make sure no summaryd serves this "
                "logdir, remove it, and start again"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            # What the lock holds is only shown: a damaged one cannot forge a log line.
            first_line = os.pread(fd, 32, 0).split(b"\n", 1)[0].decode(errors="replace")
            holder = "".join(c for c in first_line if c.isprintable()) or "?"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StateLockedError(
                    f"another summaryd (pid {holder}) serves this logdir (state directory {self.path}); "
                    "stop it first, or give this daemon another --logdir"
                ) from None
            raise
        match = re.search(rb"\nsessions (\d{1,19})\n", os.pread(fd, 128, 0))
        os.ftruncate(fd, 0)
        self._lock_text = f"{os.getpid()}\n".encode()
        os.pwrite(fd, self._lock_text, 0)
        return fd, int(match.group(1)) if match else 0

    def _witness(self, store_size: int) -> None:
        """Note the session store's size in the lock file (same length every time: one write replaces it)."""
        os.pwrite(self._lock_fd, self._lock_text + b"sessions %019d\n" % store_size, 0)

    def _open_losses(self) -> Journal:
        """Open the record of losses (kept aside and begun again when damaged) and take its horizon."""
        kept: list[dict[str, Any]] = []
        damage = ""
        try:
            losses = Journal(LOSSES_NAME, self.fd, create=False)
        except FileNotFoundError:
            return Journal(LOSSES_NAME, self.fd, create=True)
        except OSError as exc:
            if exc.errno not in NOT_A_FILE_ERRNOS:
                raise
            damage = "is not a file"
        else:
            if not losses.scan.damaged:
                losses.cut_torn()
                for record in losses.scan.records:
                    if isinstance(record.get("t"), int | float):
                        self._lost(float(record["t"]))
                return losses
            losses.close()
            damage, kept = losses.scan.describe(), losses.scan.records
        # The record of earlier losses is itself damaged: none of it can be younger than the file was last
        # written, so its modification time stands for all of it.
        when = os.lstat(LOSSES_NAME, dir_fd=self.fd).st_mtime
        kept_as = self._kept_as(self.fd, LOSSES_NAME)
        # The new record (its good lines and this loss) is complete before the damaged one is moved aside.
        temporary = LOSSES_NAME + TEMPORARY_SUFFIX
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=self.fd)

        def keep_aside() -> None:
            if damage == "is not a file":  # nothing could be read: moved aside, then the new one takes its place
                os.rename(LOSSES_NAME, kept_as, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            else:  # linked aside, then replaced in one rename: a crash leaves one of the two
                os.link(LOSSES_NAME, kept_as, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)

        line = {"t": when, "at": time.time(), "what": f"{LOSSES_NAME}: {damage}", "kept": kept_as}
        losses = Journal.replace(LOSSES_NAME, self.fd, [*kept, line], temporary=temporary, before_replace=keep_aside)
        self.damaged += 1
        for record in kept:
            if isinstance(record.get("t"), int | float):
                self._lost(float(record["t"]))
        self._lost(when)
        self._log_damage(LOSSES_NAME, damage, kept_as, when)
        return losses

    def _open_journal_dir(self) -> int:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return os.open(OPEN_DIR, flags, dir_fd=self.fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno not in NOT_A_FILE_ERRNOS:
                raise
            self.quarantine(self.fd, OPEN_DIR, "is not a directory (the journals of open files were in it)", False)
        os.mkdir(OPEN_DIR, 0o755, dir_fd=self.fd)
        return os.open(OPEN_DIR, flags, dir_fd=self.fd)

    def quarantine(self, dir_fd: int, name: str, what: str, copy: bool) -> None:
        """Keep the damaged entry `name` of `dir_fd` aside as `damaged-*` in the state directory, moved or (with
        `copy`, for a file whose good part is still used) hard-linked, after recording the loss durably."""
        when = os.lstat(name, dir_fd=dir_fd).st_mtime
        where = name if dir_fd == self.fd else f"{OPEN_DIR}/{name}"
        kept_as = self._kept_as(dir_fd, name)
        # Durable before anything moves: a crash after the move still leaves the horizon recorded.
        self._record_loss(where, what, when, kept_as)
        if copy:
            os.link(name, kept_as, src_dir_fd=dir_fd, dst_dir_fd=self.fd, follow_symlinks=False)
        else:
            os.rename(name, kept_as, src_dir_fd=dir_fd, dst_dir_fd=self.fd)
        os.fsync(self.fd)
        if dir_fd != self.fd:
            os.fsync(dir_fd)

    def _record_loss(self, where: str, what: str, when: float, kept_as: str) -> None:
        """Record in `losses` (synced) and log that `where` was found damaged, last written at `when`."""
        assert self._losses is not None
        self._losses.append({"t": when, "at": time.time(), "what": f"{where}: {what}", "kept": kept_as})
        self._losses.sync()
        self.damaged += 1
        self._lost(when)
        self._log_damage(where, what, kept_as, when)

    def _lost(self, when: float) -> None:
        """From now on, refuse to resume sessions unknown to the store that started before `when`."""
        self.lost_before = when if self.lost_before is None else max(self.lost_before, when)
        if self._store is not None:
            self._store.lost_state_before(self.lost_before)

    def _kept_as(self, dir_fd: int, name: str) -> str:
        """A free name in the state directory for the damaged entry `name` of `dir_fd`."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        prefix = "" if dir_fd == self.fd else f"{OPEN_DIR}-"
        kept_as = f"{DAMAGED_PREFIX}{stamp}-{prefix}{name}"
        n = 0
        while _exists(self.fd, kept_as):
            n += 1
            kept_as = f"{DAMAGED_PREFIX}{stamp}-{n}-{prefix}{name}"
        return kept_as

    def _log_damage(self, where: str, what: str, kept_as: str, when: float) -> None:
        log.error(
            "state directory %s: %s %s; %s; resuming sessions it may have known (started before %s) is refused "
            "rather than writing their events twice",
            self.path,
            _printable(where),
            what,
            f"kept it as {_printable(kept_as)}" if kept_as else "nothing to keep",
            time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when)),
        )

    def close(self) -> None:
        """Close the store and release the lock (the daemon is stopping)."""
        self.store.close()
        if self._losses is not None:
            self._losses.close()
        allow(self.identity)
        os.close(self.journal_dir_fd)
        os.close(self._lock_fd)
        os.close(self.fd)

    def recover(self, logdir_fd: int) -> RecoveryReport:
        """Repair the event files the previous daemon left open; see the module docstring.

        Raises:
            StateError: the logdir is the state directory, or the state could not be read or written.
        """
        if dir_identity(logdir_fd) == self.identity:
            raise StateError(
                f"the state directory {self.path} is the logdir; give --state-dir a directory of its own (by default "
                "it is <logdir>/.summaryd)"
            )
        try:
            return self._recover(logdir_fd)
        except OSError as exc:
            raise StateError(f"state directory {self.path}: recovery failed: {exc}") from None

    def _recover(self, logdir_fd: int) -> RecoveryReport:
        report = RecoveryReport()
        for name in sorted(os.listdir(self.journal_dir_fd)):
            if not name.endswith((JOURNAL_SUFFIX, TEMPORARY_SUFFIX)):
                continue
            if not stat.S_ISREG(os.lstat(name, dir_fd=self.journal_dir_fd).st_mode):
                self.quarantine(self.journal_dir_fd, name, "is not a file", False)
            elif name.endswith(JOURNAL_SUFFIX):
                self._recover_file(name, logdir_fd, report)
            else:  # a compaction the crash cut short: the journal stands
                os.unlink(name, dir_fd=self.journal_dir_fd)
        self.store.compact()
        report.damaged = self.damaged
        return report

    def _recover_file(self, journal_name: str, logdir_fd: int, report: RecoveryReport) -> None:
        scan = read(journal_name, self.journal_dir_fd)
        journaled = JournaledFile.parse(scan.records)
        if journaled is None:
            if scan.records or scan.damaged or scan.torn:
                # The header is written and synced before the event file is created: without it, which file
                # (and whose sessions) the journal was about is lost.
                what = "has no whole first line naming its run and file"
                self.quarantine(self.journal_dir_fd, journal_name, what, False)
            else:  # empty: the daemon died right after creating it, before its event file existed
                os.unlink(journal_name, dir_fd=self.journal_dir_fd)
            return
        parts = _confined(journaled)
        if isinstance(parts, str):
            self.quarantine(self.journal_dir_fd, journal_name, f"{parts}; nothing was touched", False)
            return
        if scan.damaged:
            self.quarantine(self.journal_dir_fd, journal_name, scan.describe(), True)
        try:
            marks = self._repair(journaled, parts, logdir_fd, report)
        except RunPathError as exc:
            self.quarantine(self.journal_dir_fd, journal_name, f"{exc}; nothing was touched", False)
            return
        report.files += 1
        doubtful = _doubtful(scan)
        records = [SessionRecord(sid, journaled.run_dir, last, doubtful=sid in doubtful) for sid, last in marks.items()]
        self.store.record(records, sync=True)
        report.sessions += len(records)
        os.unlink(journal_name, dir_fd=self.journal_dir_fd)
        os.fsync(self.journal_dir_fd)

    def _repair(
        self, journaled: JournaledFile, parts: list[str], logdir_fd: int, report: RecoveryReport
    ) -> dict[str, int]:
        """Cut one event file back to its last journaled end; return each session's last sequence in it.

        The run directory is opened as a live write opens it (no symlink followed, never the state directory).
        """
        where = f"{journaled.run_dir}/{journaled.file_name}"
        dir_fd = open_existing_dir(logdir_fd, parts)
        if dir_fd is None:
            log.warning("recovery: run directory of %s is gone; keeping its sequence numbers", where)
            return journaled.whole_through(2**63)[1]
        try:
            try:
                fd = os.open(journaled.file_name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, *NOT_A_FILE_ERRNOS):
                    raise
                log.warning("recovery: %s is gone or not a file; keeping its sequence numbers", where)
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


def _confined(journaled: JournaledFile) -> list[str] | str:
    """The run path a journal names, split, if a client could have written there; otherwise why not."""
    try:
        # The limits on length and depth guard the daemon's resources, not the logdir: any length will do here.
        parts = validate_run(journaled.run_dir, max_bytes=1 << 20, max_depth=1 << 10)
    except RunPathError as exc:
        return f"names a run outside the logdir's runs ({exc})"
    if parts[0] == RESERVED_RUN:
        return f"names run {journaled.run_dir!r} inside the state directory"
    name = journaled.file_name
    if "/" in name or name in ("", ".", "..") or "tfevents" not in name:
        return f"names {name!r}, which is not an event file name"
    return parts


def _doubtful(scan: Scan) -> set[str]:
    """Sessions whose last good line in a damaged journal comes before the damage (a later one may be lost)."""
    before = {r.get("s") for r in scan.records[: scan.trusted_from]}
    after = {r.get("s") for r in scan.records[scan.trusted_from :]}
    return {s for s in before - after if isinstance(s, str) and s}


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _printable(name: str) -> str:
    """A file name as one log line can show it (a crafted name cannot start a line of its own)."""
    return "".join(c if c.isprintable() else "?" for c in name)
