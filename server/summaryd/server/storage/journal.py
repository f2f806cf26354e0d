"""Journals: append-only files of CRC-checked JSON lines, and the journal of each open event file.

A line on disk is `<crc32c of the JSON as 8 hex digits> <JSON>\\n`. A crash can tear only the last line of a
journal (appends are whole or cut back, `event_file.append_whole`): an incomplete last line that still looks
like the start of a line is torn, and is cut off quietly. Anything else that fails (a whole line with a bad
checksum, bytes that cannot be the start of a line) is damage: the reader skips it, keeps every good line
around it, and says how much it skipped (`Scan`), so that the caller can report it and keep the bytes aside.

The journal of an open event file is what makes "events in the file" and "sequence numbers acknowledged"
agree after a crash. Its first line names the run directory and the file; every later line says where the
file's whole records end after a batch, and which session's sequence number that batch completed:

    3f1a09c2 {"file":"events.out.tfevents.1764450000.host.41.1","run":"exp/rank-0"}
    77b0e1d4 {"e":42}                                  <- the file_version record is whole
    0c9d22a1 {"e":9170,"q":128,"s":"4c1f...-..."}      <- session 4c1f... holds 1..128; the file ends at 9170

The daemon writes a batch to the event file first and its journal line second, and acknowledges the batch
only after both. Recovery cuts the file back to the last journaled end: whatever lies beyond it (a torn
record, or whole records of a batch that was never journaled, hence never acknowledged) goes, and the client
sends it again. The line names the end offset rather than trusting the file size, so recovery needs no scan
of the event file.

Only the last end and each session's last line matter, so a journal past `FileJournal.compact_above` bytes is
rewritten as exactly that (a new file renamed over the old one: recovery sees either, both complete).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import stat
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import google_crc32c

from summaryd.server.storage.event_file import append_whole
from summaryd.v1.atomic import replace_file

JOURNAL_SUFFIX = ".journal"
TEMPORARY_SUFFIX = ".tmp"


def encode(record: Mapping[str, Any]) -> bytes:
    """One journal line for `record`."""
    data = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
    crc: int = google_crc32c.value(data)
    return b"%08x %s\n" % (crc, data)


def batch_line(session_id: str, last: int, end: int) -> bytes:
    """`encode({"s": session_id, "q": last, "e": end})`, byte for byte, without a `json.dumps` of the mapping:
    a group commit writes one for every batch (the session's id, the one string, is quoted as `json` quotes it)."""
    data = b'{"e":%d,"q":%d,"s":%s}' % (end, last, _quoted(session_id))
    return b"%08x %s\n" % (google_crc32c.value(data), data)


@functools.lru_cache(maxsize=4096)
def _quoted(session_id: str) -> bytes:
    return json.dumps(session_id).encode()


@dataclass
class Scan:
    """What a journal's bytes hold: the good records, and what was cut or skipped."""

    records: list[dict[str, Any]]
    whole: int
    """Where the last complete line ends: the file is cut back to this (the torn tail goes)."""
    bad_lines: int = 0
    """Complete lines that failed their checksum or did not parse: damage, skipped."""
    torn: int = 0
    """Bytes of an incomplete last line that looks like the start of one (a torn append): cut quietly."""
    garbage: int = 0
    """Bytes of an incomplete last line that cannot be the start of one: damage."""
    trusted_from: int = 0
    """Index of the first record after the last damage: a record before it may have had a later update lost."""

    @property
    def damaged(self) -> bool:
        return bool(self.bad_lines or self.garbage)

    def describe(self) -> str:
        what = []
        if self.bad_lines:
            what.append(f"{self.bad_lines} corrupt line{'s' if self.bad_lines != 1 else ''}")
        if self.garbage:
            what.append(f"{self.garbage} bytes of garbage at the end")
        return f"has {' and '.join(what)} ({len(self.records)} good lines used)"


# An incomplete line as `encode` starts one: hex digits, a space, then printable ASCII (JSON with ensure_ascii).
_LINE_START = re.compile(rb"[0-9a-f]{0,8}|[0-9a-f]{8} [\x20-\x7e]*")


def decode(data: bytes) -> Scan:
    """Scan a journal's bytes: every good record, skipping (and counting) damaged lines."""
    scan = Scan([], 0)
    start = 0
    while True:
        newline = data.find(b"\n", start)
        if newline < 0:
            break
        record = _parse(data[start:newline])
        if record is None:
            scan.bad_lines += 1
            scan.trusted_from = len(scan.records)
        else:
            scan.records.append(record)
        start = newline + 1
    scan.whole = start
    tail = data[start:]
    if _LINE_START.fullmatch(tail):
        scan.torn = len(tail)
    else:
        scan.garbage = len(tail)
        scan.trusted_from = len(scan.records)
    return scan


def _parse(line: bytes) -> dict[str, Any] | None:
    crc, _, text = line.partition(b" ")
    try:
        if len(crc) != 8 or int(crc, 16) != google_crc32c.value(text):
            return None
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def read(name: str, dir_fd: int) -> Scan:
    """Read and scan the journal file `name` in `dir_fd` (never following a symlink)."""
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
    finally:
        os.close(fd)
    return decode(data)


class Journal:
    """A journal file open for appending. A failed append leaves the file as it was and raises."""

    def __init__(self, name: str, dir_fd: int, *, create: bool) -> None:
        """Open (or create) `name` in `dir_fd`; an existing journal is scanned (`scan`) but left as it is: the
        caller keeps it aside if damaged, or cuts a torn last line (`cut_torn`) before appending."""
        self.name = name
        self._dir_fd = dir_fd
        flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT | os.O_EXCL if create else 0)
        self._fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
        self.scan = Scan([], 0)
        self.size = 0
        if not create:
            try:
                if not stat.S_ISREG(os.fstat(self._fd).st_mode):
                    raise IsADirectoryError(errno.EISDIR, "not a regular file", name)
                self.scan = read(name, dir_fd)
                self.size = self.scan.whole
            except BaseException:
                self.close()
                raise

    def drop_scan(self) -> None:
        """Forget the records read at opening (once the owner has loaded them); the size they end at stays."""
        self.scan = Scan([], self.scan.whole)

    @classmethod
    def replace(
        cls,
        name: str,
        dir_fd: int,
        records: Iterable[Mapping[str, Any]],
        *,
        temporary: str,
        before_replace: Callable[[], object] | None = None,
    ) -> Journal:
        """Replace the journal `name` by one holding exactly `records` (`replace_file`: a crash leaves the old
        journal or the new one) and return the new one, open for appending.

        The new journal is opened under its `temporary` name before the rename, so that once the rename is
        done there is nothing left to fail; `before_replace` runs after that, just before the rename.
        """
        opened: list[Journal] = []

        def open_new(path: str) -> None:
            opened.append(cls(path, dir_fd, create=False))
            if before_replace is not None:
                before_replace()

        content = b"".join(encode(r) for r in records)
        try:
            replace_file(name, content, dir_fd=dir_fd, temporary=temporary, before_replace=open_new)
        except BaseException:
            for journal in opened:
                journal.close()
            raise
        [journal] = opened
        journal.name = name
        return journal

    def cut_torn(self) -> None:
        """Cut an incomplete last line (a torn append), so that the next append starts a line."""
        if os.fstat(self._fd).st_size != self.size:
            os.ftruncate(self._fd, self.size)

    def append(self, *records: Mapping[str, Any]) -> None:
        self.size = append_whole(self._fd, b"".join(encode(r) for r in records), self.size)

    def append_lines(self, lines: bytes) -> None:
        """Append lines already encoded (`encode`, or `batch_line`)."""
        self.size = append_whole(self._fd, lines, self.size)

    def sync(self) -> None:
        os.fsync(self._fd)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def remove(self) -> None:
        """Close and delete the journal."""
        self.close()
        os.unlink(self.name, dir_fd=self._dir_fd)


class FileJournal:
    """The journal of one open event file, in the state directory's `open/` folder.

    Created (and synced) before the event file itself, so that no event file can exist after a crash
    without the journal that tells recovery where its whole batches end. Deleted after the file was closed
    cleanly and the sessions' sequence numbers were recorded in the session store.
    """

    compact_above = 1 << 20

    def __init__(self, journal_dir_fd: int, run_dir: str, file_name: str) -> None:
        self.run_dir = run_dir
        self.file_name = file_name
        self._dir_fd = journal_dir_fd
        self._journal = Journal(f"{uuid.uuid4().hex}{JOURNAL_SUFFIX}", journal_dir_fd, create=True)
        try:
            self._journal.append(self._header())
            self._journal.sync()
            os.fsync(journal_dir_fd)
        except OSError:
            self._journal.remove()
            raise

    def _header(self) -> dict[str, str]:
        return {"run": self.run_dir, "file": self.file_name}

    def compact_if_large(self, marks: dict[str, int], end: int) -> None:
        """Past `compact_above` bytes: replace the journal by its header and one line per session at `end`.

        `marks` holds every session's last sequence number in the file, all of them whole by `end`.
        """
        if self._journal.size <= self.compact_above:
            return
        name = self._journal.name
        lines = [{"s": sid, "q": last, "e": end} for sid, last in marks.items()] or [{"e": end}]
        compact = Journal.replace(name, self._dir_fd, [self._header(), *lines], temporary=name + TEMPORARY_SUFFIX)
        self._journal.close()
        self._journal = compact

    def whole_through(self, end: int) -> None:
        """Record that the event file holds whole records up to `end` (after its `file_version` record)."""
        self._journal.append({"e": end})

    def batches(self, ends: Sequence[tuple[str, int, int]]) -> None:
        """Record that each batch (session id, last sequence, end) of a group commit is whole in the file, which
        ends after it at `end`, in one append."""
        self._journal.append_lines(b"".join(batch_line(session_id, last, end) for session_id, last, end in ends))

    def sync(self) -> None:
        self._journal.sync()

    def remove(self) -> None:
        self._journal.remove()

    def close(self) -> None:
        """Close without deleting: the journal stays for the next start-up's recovery."""
        self._journal.close()


@dataclass
class JournaledFile:
    """What an event file's journal says, as recovery reads it."""

    run_dir: str
    file_name: str
    # (session id or "" for the header, last sequence, end offset), in the order written.
    ends: list[tuple[str, int, int]] = field(default_factory=list)

    @classmethod
    def parse(cls, records: list[dict[str, Any]]) -> JournaledFile | None:
        """None when the header line is missing (the daemon died before it created the event file)."""
        if not records or not isinstance(records[0].get("run"), str) or not isinstance(records[0].get("file"), str):
            return None
        journaled = cls(records[0]["run"], records[0]["file"])
        for record in records[1:]:
            end = record.get("e")
            if not isinstance(end, int):
                continue
            session_id, last = record.get("s", ""), record.get("q", 0)
            journaled.ends.append((session_id if isinstance(session_id, str) else "", int(last), end))
        return journaled

    def whole_through(self, size: int) -> tuple[int, dict[str, int]]:
        """For a file found at `size` bytes: where to cut it, and each session's last sequence before the cut.

        The cut is the last journaled end not beyond the file's size; -1 when not even the `file_version`
        record was journaled (the file is then a torn header at most).
        """
        cut = -1
        marks: dict[str, int] = {}
        for session_id, last, end in self.ends:
            if end > size:
                break
            cut = end
            if session_id:
                marks[session_id] = max(marks.get(session_id, 0), last)
        return cut, marks
