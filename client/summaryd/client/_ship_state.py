"""The shipper's checkpoint: for every event file, the session that carries it and how far the daemon has it.

One JSON file, replaced whole (written to a temporary file, fsynced, renamed, directory fsynced), so a kill at
any instant leaves the previous checkpoint or the new one, never a torn one:

    {"format": "summaryd-ship/1", "files": {"<path relative to DIR>": {
        "session_id": "<uuid>",      the session that carries this file's records (durable, so a restarted
                                     shipper resumes it and the daemon drops what it already holds)
        "session_started": <secs>,   when that id was made (the daemon's check against damaged state)
        "offset": <bytes>,           the end of the last record the daemon acknowledged
        "next_sequence": <n>}}}      the sequence number the record at `offset` gets

A checkpoint may lag the daemon (the shipper is killed between an ack and the next checkpoint): the records
after `offset` are then sent again under the same sequence numbers, and the daemon drops them.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

FORMAT = "summaryd-ship/1"


@dataclass
class FileCursor:
    """Where one event file stands: its session, the acknowledged offset and the next sequence number."""

    session_id: str
    session_started: float
    offset: int = 0
    next_sequence: int = 1

    @classmethod
    def fresh(cls, offset: int = 0) -> FileCursor:
        """A new session for the records from `offset` on (a new file, or one whose session was closed)."""
        return cls(session_id=str(uuid.uuid4()), session_started=time.time(), offset=offset)

    def renew(self) -> None:
        """A new session for the records from the offset on (the file's session was closed)."""
        self.session_id, self.session_started, self.next_sequence = str(uuid.uuid4()), time.time(), 1

    def advance(self, offset: int, next_sequence: int | None = None) -> None:
        """The records before `offset` are delivered or skipped; the next one sent gets `next_sequence`."""
        self.offset = offset
        if next_sequence is not None:
            self.next_sequence = next_sequence


class Checkpoint:
    """The cursors of every file under the shipped directory, saved durably by `save()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.files: dict[str, FileCursor] = {}
        if path.exists():
            state = json.loads(path.read_text())
            if state.get("format") != FORMAT:
                raise ValueError(f"{path}: format {state.get('format')!r}, not {FORMAT!r}; give another --state file")
            self.files = {name: FileCursor(**cursor) for name, cursor in state["files"].items()}

    def cursor(self, name: str) -> FileCursor:
        """The cursor of file `name`, made (a new session from offset 0) on first sight."""
        cursor = self.files.get(name)
        if cursor is None:
            cursor = self.files[name] = FileCursor.fresh()
        return cursor

    def save(self) -> None:
        """Replace the checkpoint file whole and durably."""
        content = json.dumps({"format": FORMAT, "files": {n: asdict(c) for n, c in self.files.items()}}, indent=1)
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
