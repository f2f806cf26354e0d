"""`summaryd replay PATH`: deliver the spools that client processes left behind, exactly once.

A spool (see `_spool`) holds a session's unacknowledged events with their sequence numbers. Replay resumes
that very session: the daemon answers `OpenSession` with the last sequence number it holds for it (it
remembers sessions across restarts), replay sends only what comes after, then closes the session, and records
`delivered_through` in the manifest. Replaying again sends nothing: the manifest says it is done, and were the
manifest lost, the daemon would still drop every event it holds (or refuse the closed session, whose close
answers how far it got).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc

from summaryd.client._channel import ChannelSettings, open_channel
from summaryd.client._spool import FORMAT, MANIFEST, SpoolLockedError, lock, whole_records, write_manifest
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

_BATCH_EVENTS = 1024
_BATCH_BYTES = 1024 * 1024


@dataclass
class ReplayResult:
    """What `replay_spool` did with one spool."""

    path: str
    session_id: str = ""
    run: str = ""
    address: str = ""
    events: int = 0
    """Events in the spool."""
    first_sequence: int = 0
    last_sequence: int = 0
    sent: int = 0
    """Events the daemon wrote during this replay."""
    held: int = 0
    """Events the daemon held already (delivered before the process ended, or by an earlier replay)."""
    synced: bool = False
    already: bool = False
    """An earlier replay delivered everything (per the manifest); nothing was sent."""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        """One line for the terminal."""
        if self.error is not None:
            return f"{self.path}: FAILED: {self.error}"
        if self.already:
            return (
                f"{self.path}: already delivered ({self.events} events of run {self.run!r} through sequence "
                f"{self.last_sequence}); nothing sent"
            )
        return (
            f"{self.path}: delivered {self.sent} events of run {self.run!r} to {self.address} (session "
            f"{self.session_id}, sequences {self.first_sequence}..{self.last_sequence}); {self.held} were there "
            f"already; {'synced' if self.synced else 'NOT synced'}"
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def find_spools(path: Path) -> list[Path]:
    """`path` itself when it is a spool, else the spools inside it (a spool root: its sessions' spools, and
    the outboxes of forked children in its `children-of-<pid>` folders), sorted."""
    if (path / MANIFEST).is_file():
        return [path]
    if not path.is_dir():
        return []
    spools = [child for child in path.iterdir() if (child / MANIFEST).is_file()]
    spools += [box for folder in path.glob("children-of-*") for box in folder.iterdir() if (box / MANIFEST).is_file()]
    return sorted(spools)


def replay(path: Path, address: str | None = None, timeout: float = 30.0) -> list[ReplayResult]:
    """Replay every spool at `path` (a spool, or a spool root)."""
    return [replay_spool(spool, address, timeout) for spool in find_spools(path)]


def replay_spool(directory: Path, address: str | None = None, timeout: float = 30.0) -> ReplayResult:
    """Deliver one spool to `address` (default: the daemon its process was logging to)."""
    result = ReplayResult(str(directory))
    try:
        lock_fd = lock(directory)
    except (SpoolLockedError, OSError) as exc:
        result.error = str(exc)
        return result
    try:
        _replay_locked(directory, address, timeout, result)
    except (OSError, ValueError, KeyError) as exc:
        result.error = f"unreadable spool: {exc}"
    except grpc.RpcError as exc:
        result.error = f"{exc.code().name}: {exc.details()}"
    finally:
        os.close(lock_fd)
    return result


def _replay_locked(directory: Path, address: str | None, timeout: float, result: ReplayResult) -> None:
    manifest: dict[str, Any] = json.loads((directory / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{MANIFEST} has format {manifest.get('format')!r}, not {FORMAT!r}")
    records = list(whole_records((directory / manifest["file"]).read_bytes()))
    events = records[1:]  # after the file_version record
    first = int(manifest["first_sequence"])
    result.session_id, result.run = manifest["session_id"], manifest["run"]
    result.address = address or manifest["address"]
    result.events, result.first_sequence, result.last_sequence = len(events), first, first + len(events) - 1
    if int(manifest.get("delivered_through", 0)) >= result.last_sequence:
        result.already, result.held, result.synced = True, len(events), True
        return
    with open_channel(result.address, ChannelSettings.from_environment()) as ch:
        stub = pb_grpc.SummariesStub(ch)
        held_through = _resume(stub, manifest, first, result, timeout)
        if held_through is None:  # the session was closed: the daemon holds all it ever will
            held_through = result.last_sequence
        else:
            start = max(first, held_through + 1)
            if start <= result.last_sequence:
                acked = send_events(stub, result.session_id, start, events[start - first :], timeout)
                if acked < result.last_sequence:
                    raise ValueError(f"the daemon acknowledged through {acked}, not {result.last_sequence}")
                result.sent = result.last_sequence - start + 1
            stub.CloseSession(pb.CloseSessionRequest(session_id=result.session_id), timeout=timeout)
        result.held = len(events) - result.sent
        result.synced = True
    manifest["delivered_through"] = result.last_sequence
    manifest["replayed"] = {"at": time.time(), "address": result.address, "sent": result.sent, "held": result.held}
    write_manifest(directory, manifest)


def open_request(manifest: dict[str, Any], next_sequence: int, framework: str) -> pb.OpenSessionRequest:
    """The `OpenSession` that resumes a spool's session (as the process that wrote it, when known)."""
    return pb.OpenSessionRequest(
        session_id=manifest["session_id"],
        run=manifest["run"],
        worker=manifest.get("worker", ""),
        world_size=int(manifest.get("world_size", 1)),
        client=pb.ClientIdentity(
            host=str(manifest.get("host") or socket.gethostname()),
            pid=int(manifest.get("pid") or os.getpid()),
            framework=framework,
        ),
        next_sequence=next_sequence,
    )


def _resume(
    stub: pb_grpc.SummariesStub, manifest: dict[str, Any], first: int, result: ReplayResult, timeout: float
) -> int | None:
    """Open the spool's session; return the last sequence the daemon holds, or None if it was closed."""
    request = open_request(manifest, first, "summaryd-replay")
    try:
        answer = stub.OpenSession(request, timeout=timeout)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or "was closed" not in (exc.details() or ""):
            raise
        closed = stub.CloseSession(pb.CloseSessionRequest(session_id=result.session_id), timeout=timeout)
        if closed.acked_sequence < result.last_sequence:
            raise ValueError(
                f"session {result.session_id} was closed at sequence {closed.acked_sequence}, before the spool's "
                f"last event {result.last_sequence}"
            ) from None
        return None
    last: int = answer.last_sequence
    return last


def send_events(stub: pb_grpc.SummariesStub, session_id: str, start: int, events: list[bytes], timeout: float) -> int:
    """Stream `events` (sequences from `start`) and return the last acknowledged sequence number."""

    def requests() -> Iterator[pb.WriteRequest]:
        index = 0
        while index < len(events):
            batch: list[bytes] = []
            size = 0
            while index < len(events) and len(batch) < _BATCH_EVENTS and size < _BATCH_BYTES:
                batch.append(events[index])
                size += len(events[index])
                index += 1
            yield pb.WriteRequest(session_id=session_id, first_sequence=start + index - len(batch), events=batch)

    acked = 0
    # The deadline grows with the spool: a large one takes a while to write, a stuck daemon still times out.
    for ack in stub.Write(requests(), timeout=timeout + len(events) / 10_000):
        acked = max(acked, ack.acked_sequence)
    return acked
