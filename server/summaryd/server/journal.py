"""Journals: append-only files of CRC-checked JSON lines, and the journal of each open event file.

A line on disk is `<crc32c of the JSON as 8 hex digits> <JSON>\\n`. A crash can tear only the last line of a
journal (appends are whole or cut back, `event_file.append_whole`), and a reader stops at the first line that
is incomplete or fails its checksum, so a torn line is simply not there.

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

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import google_crc32c

from summaryd.server.event_file import append_whole

JOURNAL_SUFFIX = ".journal"
TEMPORARY_SUFFIX = ".tmp"


def encode(record: Mapping[str, Any]) -> bytes:
    """One journal line for `record`."""
    data = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
    crc: int = google_crc32c.value(data)
    return b"%08x %s\n" % (crc, data)


def decode(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The records of a journal's bytes, up to the first torn or corrupt line, and where that good part ends."""
    records: list[dict[str, Any]] = []
    good = 0
    while True:
        newline = data.find(b"\n", good)
        if newline < 0:
            return records, good
        line = data[good:newline]
        crc, _, text = line.partition(b" ")
        try:
            if len(crc) != 8 or int(crc, 16) != google_crc32c.value(text):
                return records, good
            record = json.loads(text)
        except ValueError:
            return records, good
        if not isinstance(record, dict):
            return records, good
        records.append(record)
        good = newline + 1


def read(name: str, dir_fd: int) -> tuple[list[dict[str, Any]], int]:
    """Read the journal file `name` in `dir_fd`: its good records and the size of their part of the file."""
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
        """Open (or create) `name` in `dir_fd`; an existing journal's torn tail, if any, is cut off first."""
        self.name = name
        self._dir_fd = dir_fd
        flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT | os.O_EXCL if create else 0)
        self._fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
        self.records: list[dict[str, Any]] = []
        self.size = 0
        if not create:
            self.records, self.size = read(name, dir_fd)
            if os.fstat(self._fd).st_size != self.size:
                os.ftruncate(self._fd, self.size)

    def append(self, *records: Mapping[str, Any]) -> None:
        self.size = append_whole(self._fd, b"".join(encode(r) for r in records), self.size)

    def sync(self) -> None:
        os.fsync(self._fd)

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
        compact = Journal(name + TEMPORARY_SUFFIX, self._dir_fd, create=True)
        try:
            lines = [{"s": sid, "q": last, "e": end} for sid, last in marks.items()] or [{"e": end}]
            compact.append(self._header(), *lines)
            compact.sync()
            os.rename(compact.name, name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
        except OSError:
            compact.remove()
            raise
        compact.name = name
        self._journal.close()
        self._journal = compact

    def whole_through(self, end: int) -> None:
        """Record that the event file holds whole records up to `end` (after its `file_version` record)."""
        self._journal.append({"e": end})

    def batch(self, session_id: str, last: int, end: int) -> None:
        """Record that a batch of `session_id` through sequence `last` is whole in the file, which ends at `end`."""
        self._journal.append({"s": session_id, "q": last, "e": end})

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
