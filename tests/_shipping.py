"""Event files as a native writer leaves them, for the shipper's tests: records framed and appended to a file,
and the `summaryd ship` command line a user types."""

from __future__ import annotations

import sys
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event

from summaryd.v1.wire import frame

VERSION_RECORD = Event(wall_time=1.0, file_version="brain.Event:2").SerializeToString()


def scalar(step: int, tag: str = "loss") -> bytes:
    # A wall time with many digits: re-encoding it anywhere on the way would show in the bytes.
    event = Event(wall_time=1_700_000_000.123456789 + step, step=step)
    event.summary.value.add(tag=tag, simple_value=step * 0.5)
    return event.SerializeToString()


def append(path: Path, *records: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(b"".join(frame(r) for r in records))


def ship_argv(directory: Path, run: str, address: str, *flags: str) -> list[str]:
    """`summaryd ship DIR --run RUN --address A [flags]` as a user runs it."""
    return [sys.executable, "-m", "summaryd.server", "ship", str(directory), "--run", run, "--address", address, *flags]
