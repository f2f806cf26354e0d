"""The shipper's checkpoint: for every event file, the session that carries it and how far the daemon has it.

One JSON file, replaced whole (written to a temporary file, fsynced, renamed, directory fsynced), so a kill at
any instant leaves the previous checkpoint or the new one, never a torn one:

    {"format": "summaryd-ship/1", "files": {"<path relative to DIR>": {
        "session_id": "<uuid>",      the session that carries this file's records (durable, so a restarted
                                     shipper resumes it and the daemon drops what it already holds)
        "session_started": <secs>,   when that id was made (the daemon's check against damaged state)
        "offset": <bytes>,           the end of the last record the daemon holds durably: acknowledged from a
                                     daemon on a local logdir, uploaded (`durable_sequence`) on a bucket
        "next_sequence": <n>,        the sequence number the record at `offset` gets
        "session_offset": <bytes>,   where the session's record number 1 starts
        "skipped": [<bytes>, ...],   the offsets of records of the session the daemon refused (not numbered)
        "device": <n>, "inode": <n>, "head": "<hex>"}}}  what the file is (and its first bytes): another
                                     file under its name, or one rewritten, starts anew

A checkpoint may lag the daemon (the shipper is killed between an ack and the next checkpoint, or the daemon
has not uploaded yet): the records after `offset` are then sent again under the same sequence numbers, and the
daemon drops those it holds. A daemon that holds less than the checkpoint says (it lost its state) names
where it stands when the session opens; the shipper finds that record again from `session_offset`.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = "summaryd-ship/1"
_SAVED = (
    "session_id",
    "session_started",
    "offset",
    "next_sequence",
    "session_offset",
    "skipped",
    "device",
    "inode",
    "head",
)


@dataclass
class FileCursor:
    """Where one event file stands: its session, the durable offset and next sequence number (saved), and how
    far this process has had it acknowledged (`read_offset`, `read_next`; not saved)."""

    session_id: str
    session_started: float
    offset: int = 0
    next_sequence: int = 1
    session_offset: int = 0
    skipped: list[int] = field(default_factory=list)
    device: int = 0
    inode: int = 0
    head: str = ""
    read_offset: int = field(default=-1, compare=False)
    read_next: int = field(default=0, compare=False)
    # Acknowledged, not yet durable: (the sequence number that must be durable, offset, next sequence number).
    marks: list[tuple[int, int, int]] = field(default_factory=list, compare=False)

    def __post_init__(self) -> None:
        if self.read_offset < 0:
            self.read_offset, self.read_next = self.offset, self.next_sequence

    @classmethod
    def fresh(cls, offset: int = 0, device: int = 0, inode: int = 0) -> FileCursor:
        """A new session for the records from `offset` on (a new file, or one whose session was closed)."""
        return cls(
            session_id=str(uuid.uuid4()),
            session_started=time.time(),
            offset=offset,
            session_offset=offset,
            device=device,
            inode=inode,
        )

    def successor(self) -> FileCursor:
        """The same file in a new session from where this one was acknowledged (its session was closed)."""
        cursor = FileCursor.fresh(self.read_offset, self.device, self.inode)
        cursor.head = self.head
        return cursor

    def renew(self, offset: int) -> None:
        """A new session for the records from `offset` on (the file's session was closed holding those before)."""
        self.session_id, self.session_started = str(uuid.uuid4()), time.time()
        self.session_offset, self.skipped = offset, []
        self.reset_to(offset, 1)
        self.offset, self.next_sequence = offset, 1

    def reset_to(self, offset: int, next_sequence: int) -> None:
        """Send again from the record at `offset`, numbered `next_sequence` (what the daemon holds); the durable
        position moves back with it when it was beyond."""
        self.read_offset, self.read_next = offset, next_sequence
        self.marks = [mark for mark in self.marks if mark[2] <= next_sequence]
        if self.next_sequence > next_sequence:
            self.offset, self.next_sequence = offset, next_sequence

    def acknowledged(self, offset: int, next_sequence: int | None = None) -> None:
        """The records before `offset` are acknowledged (or skipped); the next one sent gets `next_sequence`.
        They count as durable once the daemon says so of the sequence number before it (`durable_through`)."""
        if offset == self.read_offset and next_sequence in (None, self.read_next):
            return
        if next_sequence is not None:
            self.read_next = next_sequence
        self.read_offset = offset
        self.marks.append((self.read_next - 1, offset, self.read_next))

    def durable_through(self, durable: int) -> bool:
        """The daemon holds every sequence number through `durable` durably; whether the saved position moved."""
        moved = False
        while self.marks and self.marks[0][0] <= durable:
            _, self.offset, self.next_sequence = self.marks.pop(0)
            moved = True
        return moved

    def saved(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in _SAVED}


def _loaded(saved: dict[str, object]) -> FileCursor:
    cursor = FileCursor(**{k: v for k, v in saved.items() if k in _SAVED})  # type: ignore[arg-type]
    if "session_offset" not in saved and cursor.next_sequence == 1:  # saved before it was: known in this case
        cursor.session_offset = cursor.offset
    return cursor


class Checkpoint:
    """The cursors of every file under the shipped directory, saved durably by `save()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.files: dict[str, FileCursor] = {}
        if path.exists():
            state = json.loads(path.read_text())
            if state.get("format") != FORMAT:
                raise ValueError(f"{path}: format {state.get('format')!r}, not {FORMAT!r}; give another --state file")
            self.files = {name: _loaded(cursor) for name, cursor in state["files"].items()}

    def cursor(self, name: str) -> FileCursor:
        """The cursor of file `name`, made (a new session from offset 0) on first sight."""
        cursor = self.files.get(name)
        if cursor is None:
            cursor = self.files[name] = FileCursor.fresh()
        return cursor

    def save(self) -> None:
        """Replace the checkpoint file whole and durably."""
        content = json.dumps({"format": FORMAT, "files": {n: c.saved() for n, c in self.files.items()}}, indent=1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(temporary, "w") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
