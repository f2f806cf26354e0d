"""`summaryd replay PATH`: deliver the spools that client processes left behind, exactly once.

A spool (see `_spool`) holds a session's unacknowledged events with their sequence numbers. Replay resumes
that very session: the daemon answers `OpenSession` with the last sequence number it holds for it (it
remembers sessions across restarts), replay sends only what comes after, then closes the session, and records
`delivered_through` in the manifest. Replaying again sends nothing: the manifest says it is done, and were the
manifest lost, the daemon would still drop every event it holds (or refuse the closed session, whose close
answers how far it got).

The session's files spool (`<spool>.files`, projector files the daemon did not take) is uploaded in the same
session, after its events and before the close; when the session was closed already, in a new session of the
same run. A files spool without events is replayed alone the same way.

Once the daemon has confirmed everything (the session is closed, its file synced), the spool is removed, unless
`keep` asks to leave it (a later replay of a kept spool sends nothing). The daemons are the ones given, else
`SUMMARYD_ADDRESS`, else all those the spool's process was given (with its redirect allow-list); the result
says which. Of several, one that is away gives way to the next, and one that names the run's owner sends the
replay there when the owner is one of them or of `redirect_allow` (`_failover.DaemonChannel`; a redirect
elsewhere is refused and the spool kept): each attempt resumes the session, so none doubles an event.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc

from summaryd.client._channel import ChannelSettings
from summaryd.client._environment import parse_addresses, resolve_redirect_allow
from summaryd.client._sender._batch_fit import DaemonLimits
from summaryd.client._sender._failover import DaemonChannel
from summaryd.client._sender._targets import RedirectRefusedError
from summaryd.client._spool import (
    FILES_FORMAT,
    FILES_SUFFIX,
    FORMAT,
    MANIFEST,
    SpoolLockedError,
    files_spool_of,
    lock,
    recorded_daemons,
    spooled_files,
    write_manifest,
)
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import whole_records

_BATCH_EVENTS = 1024
RECORDED = "recorded in the spool"
"""`ReplayResult.address_from` when the address is the one the spool's process was logging to."""
_BATCH_BYTES = 1024 * 1024


@dataclass
class ReplayResult:
    """What `replay_spool` did with one spool."""

    path: str
    session_id: str = ""
    run: str = ""
    address: str = ""
    address_from: str = ""
    """Where the address came from: `--address`, `SUMMARYD_ADDRESS`, or `RECORDED`."""
    recorded_allow: tuple[str, ...] = ()
    """The redirect allow-list the spool records (followed only with the addresses it records)."""
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
    files: int = 0
    """Projector files uploaded from the session's files spool."""
    removed: bool = False
    """The daemon confirmed everything and the spool was deleted."""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        """One line for the terminal."""
        if self.error is not None:
            target = f" (daemon {self.address}, {self.address_from})" if self.address else ""
            return f"{self.path}: FAILED{target}: {self.error}"
        ending = "; spool removed" if self.removed else "; spool kept"
        if self.already:
            return (
                f"{self.path}: already delivered ({self.events} events of run {self.run!r} through sequence "
                f"{self.last_sequence}); nothing sent{ending}"
            )
        daemon = f"{self.address} ({self.address_from})"
        files = f"; uploaded {self.files} projector files" if self.files else ""
        if not self.events:
            return f"{self.path}: uploaded {self.files} projector files of run {self.run!r} to {daemon}{ending}"
        return (
            f"{self.path}: delivered {self.sent} events of run {self.run!r} to {daemon} (session "
            f"{self.session_id}, sequences {self.first_sequence}..{self.last_sequence}); {self.held} were there "
            f"already; {'synced' if self.synced else 'NOT synced'}{files}{ending}"
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
    # A files spool goes with its session's events spool, when there is one.
    return sorted(spool for spool in spools if not _goes_with_events(spool))


def _goes_with_events(spool: Path) -> bool:
    """Whether `spool` is a files spool whose session has an events spool (replayed together)."""
    return spool.name.endswith(FILES_SUFFIX) and (_events_of(spool) / MANIFEST).is_file()


def _events_of(spool: Path) -> Path:
    """The events spool of a files spool's session (`spool` itself when it is no files spool)."""
    return spool.with_name(spool.name.removesuffix(FILES_SUFFIX))


def replay(
    path: Path,
    address: str | None = None,
    timeout: float = 30.0,
    *,
    keep: bool = False,
    redirect_allow: str | None = None,
    environ: dict[str, str] | os._Environ[str] = os.environ,
) -> list[ReplayResult]:
    """Replay every spool at `path` (a spool, or a spool root) to `address`, else `SUMMARYD_ADDRESS`, else the
    address each spool records; remove each spool the daemon confirmed whole unless `keep`. A redirect is
    followed to those addresses and `redirect_allow` (else `SUMMARYD_REDIRECT_ALLOW`) only.

    Raises:
        ValueError: `address` (or `SUMMARYD_ADDRESS`, `redirect_allow`) is not a daemon address, or the token
            and TLS variables do not go together.
    """
    settings = ChannelSettings.from_environment(environ=environ)
    allow = resolve_redirect_allow(redirect_allow, environ)
    if address:
        target: tuple[str, str] | None = (",".join(parse_addresses(address)), "--address")
    elif environ.get("SUMMARYD_ADDRESS"):
        try:
            target = (",".join(parse_addresses(environ["SUMMARYD_ADDRESS"])), "SUMMARYD_ADDRESS")
        except ValueError as exc:
            raise ValueError(f"SUMMARYD_ADDRESS: {exc}") from None
    else:
        target = None
    return [
        replay_spool(spool, target, timeout, keep=keep, settings=settings, redirect_allow=allow)
        for spool in find_spools(path)
    ]


def replay_spool(
    directory: Path,
    target: tuple[str, str] | None = None,
    timeout: float = 30.0,
    *,
    keep: bool = False,
    settings: ChannelSettings,
    redirect_allow: tuple[str, ...] = (),
) -> ReplayResult:
    """Deliver one spool to `target` (comma-separated addresses and where they came from; default: the daemon its
    process was logging to) with `settings` (token and TLS, made once by the caller), following redirects to
    those addresses and `redirect_allow` only; then remove it unless `keep`."""
    if _goes_with_events(directory):
        directory = _events_of(directory)
    result = ReplayResult(str(directory))
    if target is not None:
        result.address, result.address_from = target
    try:
        lock_fd = lock(directory)
    except (SpoolLockedError, OSError) as exc:
        result.error = str(exc)
        return result
    try:
        if directory.name.endswith(FILES_SUFFIX):
            _replay_files_alone(directory, timeout, result, _Daemons(settings, redirect_allow))
        else:
            _replay_locked(directory, timeout, result, _Daemons(settings, redirect_allow))
        if not keep and result.synced:
            _remove(files_spool_of(directory))
            _remove(directory)
            result.removed = True
    except (OSError, ValueError, KeyError) as exc:
        result.error = f"unreadable spool: {exc}"
    except grpc.RpcError as exc:
        result.error = f"{exc.code().name}: {exc.details()}"
    except RedirectRefusedError as exc:
        result.error = str(exc)
    finally:
        os.close(lock_fd)
    return result


def _remove(spool: Path) -> None:
    """Delete a delivered spool: the manifest first, so that a half-deleted spool is never replayed."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(spool / MANIFEST)
    shutil.rmtree(spool, ignore_errors=True)


def _address(result: ReplayResult, manifest: dict[str, Any]) -> None:
    if not result.address:
        addresses, result.recorded_allow = recorded_daemons(manifest)
        result.address, result.address_from = ",".join(addresses), RECORDED


@dataclass(frozen=True)
class _Daemons:
    """How to reach the daemons: token and TLS, and the addresses beyond the spool's that a redirect may reach."""

    settings: ChannelSettings
    redirect_allow: tuple[str, ...]


def _replay_locked(directory: Path, timeout: float, result: ReplayResult, reach: _Daemons) -> None:
    files_spool = files_spool_of(directory)
    if not (files_spool / MANIFEST).is_file():
        _replay_events(directory, timeout, result, reach)
        return
    files_lock = lock(files_spool)  # its process may still be writing it
    try:
        _replay_events(directory, timeout, result, reach)
    finally:
        os.close(files_lock)


def _replay_events(directory: Path, timeout: float, result: ReplayResult, reach: _Daemons) -> None:
    manifest = _manifest(directory, FORMAT)
    records = list(whole_records((directory / manifest["file"]).read_bytes()))
    events = records[1:]  # after the file_version record
    first = int(manifest["first_sequence"])
    result.session_id, result.run = manifest["session_id"], manifest["run"]
    _address(result, manifest)
    result.events, result.first_sequence, result.last_sequence = len(events), first, first + len(events) - 1
    files_spool = files_spool_of(directory)
    files = _pending_files(files_spool)
    if int(manifest.get("delivered_through", 0)) >= result.last_sequence and files is None:
        result.already, result.held, result.synced = True, len(events), True
        return

    def deliver(stub: pb_grpc.SummariesStub) -> None:
        resumed = _resume(stub, manifest, first, result, timeout)
        if resumed is None:  # the session was closed: the daemon holds all it ever will
            if files is not None:
                result.files = _upload(stub, manifest, None, files_spool, files, timeout)
            return
        held_through, limits = resumed
        start = max(first, held_through + 1)
        if start <= result.last_sequence:
            acked = send_events(stub, result.session_id, start, events[start - first :], timeout, limits)
            if acked < result.last_sequence:
                raise ValueError(f"the daemon acknowledged through {acked}, not {result.last_sequence}")
            result.sent = result.last_sequence - start + 1
        if files is not None:
            result.files = _upload(stub, manifest, result.session_id, files_spool, files, timeout)
        stub.CloseSession(pb.CloseSessionRequest(session_id=result.session_id), timeout=timeout)

    _on_a_daemon(result, reach, deliver)
    result.held = len(events) - result.sent
    result.synced = True
    manifest["delivered_through"] = result.last_sequence
    manifest["replayed"] = {"at": time.time(), "address": result.address, "sent": result.sent, "held": result.held}
    write_manifest(directory, manifest)


def _replay_files_alone(directory: Path, timeout: float, result: ReplayResult, reach: _Daemons) -> None:
    """A files spool whose session has no events spool: upload into that session (resumed, then closed), or
    into a new one of the same run when it was closed."""
    manifest = _manifest(directory, FILES_FORMAT)
    result.session_id, result.run = manifest["session_id"], manifest["run"]
    _address(result, manifest)
    files = _pending_files(directory)
    if files is None:
        result.already, result.synced = True, True
        return

    def deliver(stub: pb_grpc.SummariesStub) -> None:
        try:
            stub.OpenSession(open_request(manifest, 1, "summaryd-replay"), timeout=timeout)
            session_id: str | None = result.session_id
        except grpc.RpcError as exc:
            if not _was_closed(exc):
                raise
            session_id = None
        result.files = _upload(stub, manifest, session_id, directory, files, timeout)
        if session_id is not None:
            stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), timeout=timeout)

    _on_a_daemon(result, reach, deliver)
    result.synced = True


def _on_a_daemon(result: ReplayResult, reach: _Daemons, deliver: Callable[[pb_grpc.SummariesStub], None]) -> None:
    """`deliver` to the first of the result's daemons that takes it; the result names that one."""
    # The allow-list the spool records goes with the addresses it records, not with the ones the user gives now.
    allow = (*reach.redirect_allow, *result.recorded_allow) if result.address_from == RECORDED else reach.redirect_allow
    daemons = DaemonChannel(parse_addresses(result.address), reach.settings, allow)
    try:
        daemons.call(deliver)
    finally:
        daemons.close()
    result.address = daemons.address


def _was_closed(error: grpc.RpcError) -> bool:
    """Whether `OpenSession` was refused because the session was closed (it cannot be resumed)."""
    return error.code() == grpc.StatusCode.FAILED_PRECONDITION and "was closed" in (error.details() or "")


def _manifest(directory: Path, expected: str) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((directory / MANIFEST).read_text())
    if manifest.get("format") != expected:
        raise ValueError(f"{MANIFEST} has format {manifest.get('format')!r}, not {expected!r}")
    return manifest


def _pending_files(directory: Path) -> list[tuple[str, bytes]] | None:
    """The files a files spool (locked by the caller) holds that no replay uploaded yet; None when none."""
    if not (directory / MANIFEST).is_file():
        return None
    manifest = _manifest(directory, FILES_FORMAT)
    if manifest.get("uploaded"):
        return None
    return spooled_files(directory)


def _upload(
    stub: pb_grpc.SummariesStub,
    manifest: dict[str, Any],
    session_id: str | None,
    directory: Path,
    files: list[tuple[str, bytes]],
    timeout: float,
) -> int:
    """Upload spooled files into the open session `session_id`, or into a new session of the same run when it
    is None (closed); then mark the files spool uploaded, so that a second replay sends nothing."""
    fresh = session_id is None
    if session_id is None:
        session_id = str(uuid.uuid4())
        fresh_manifest = {**manifest, "session_id": session_id, "session_started": time.time()}
        stub.OpenSession(open_request(fresh_manifest, 1, "summaryd-replay"), timeout=timeout)
    for path, content in files:
        stub.PutFile(pb.PutFileRequest(session_id=session_id, path=path, content=content), timeout=timeout)
    if fresh:
        stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), timeout=timeout)
    files_manifest = _manifest(directory, FILES_FORMAT)
    files_manifest["uploaded"] = {"at": time.time(), "files": len(files), "session_id": session_id}
    write_manifest(directory, files_manifest)
    return len(files)


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
        # A spool written before this field existed says when it was created: the session started no later.
        session_started=float(manifest.get("session_started") or manifest.get("created") or 0),
    )


def _resume(
    stub: pb_grpc.SummariesStub, manifest: dict[str, Any], first: int, result: ReplayResult, timeout: float
) -> tuple[int, DaemonLimits] | None:
    """Open the spool's session; return the last sequence the daemon holds and the limits it states, or None if
    the session was closed."""
    request = open_request(manifest, first, "summaryd-replay")
    try:
        answer = stub.OpenSession(request, timeout=timeout)
    except grpc.RpcError as exc:
        if not _was_closed(exc):
            raise
        closed = stub.CloseSession(pb.CloseSessionRequest(session_id=result.session_id), timeout=timeout)
        if closed.acked_sequence < result.last_sequence:
            raise ValueError(
                f"session {result.session_id} was closed at sequence {closed.acked_sequence}, before the spool's "
                f"last event {result.last_sequence}"
            ) from None
        return None
    last: int = answer.last_sequence
    return last, DaemonLimits.of(answer)


def send_events(
    stub: pb_grpc.SummariesStub,
    session_id: str,
    start: int,
    events: list[bytes],
    timeout: float,
    limits: DaemonLimits | None = None,
) -> int:
    """Stream `events` (sequences from `start`), in batches cut to the daemon's `limits`, and return the last
    acknowledged sequence number."""
    limits = limits or DaemonLimits()

    def requests() -> Iterator[pb.WriteRequest]:
        index = 0
        while index < len(events):
            batch: list[bytes] = []
            size = 0
            while index < len(events) and len(batch) < _BATCH_EVENTS and size < _BATCH_BYTES:
                batch.append(events[index])
                size += len(events[index])
                index += 1
            first = start + index - len(batch)
            for part in limits.split(batch, size, session_id):
                yield pb.WriteRequest(session_id=session_id, first_sequence=first, events=part)
                first += len(part)

    acked = 0
    # The deadline grows with the spool: a large one takes a while to write, a stuck daemon still times out.
    for ack in stub.Write(requests(), timeout=timeout + len(events) / 10_000):
        acked = max(acked, ack.acked_sequence)
    return acked
