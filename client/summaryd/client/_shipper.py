"""`Shipper`: streams the records of event files that something else writes to the daemon, exactly once.

Each directory under the shipped directory that holds `tfevents` files is a run below the run root given
(`DIR/a/b/events...` goes to `<run>/a/b`). Every file is carried by its own session, whose id the checkpoint
keeps (`_ship_state`); its records are numbered 1, 2, ... in file order, so the daemon drops a record it
already holds when a restarted shipper (or a shipper talking to a restarted daemon) sends it again.

Records pass through as they are in the file: never parsed and encoded again, so the daemon's file holds the
same bytes. Only the file's first record, `file_version`, stays behind: the daemon writes its own. A record not
yet whole at the end of a file (its writer is still at it) waits for the next pass.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError
from tensorboard.compat.proto.event_pb2 import Event

from summaryd.client._channel import ChannelSettings
from summaryd.client._environment import resolve_addresses, resolve_redirect_allow
from summaryd.client._failover import DaemonChannel
from summaryd.client._sender._grpc_transport import refused_sequence
from summaryd.client._sender._targets import RedirectRefusedError
from summaryd.client._ship_state import Checkpoint, FileCursor
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1.runpath import run_dir_parts
from summaryd.v1.wire import FRAMING_BYTES, VERSION, read_records

log = logging.getLogger("summaryd.ship")

STATE_NAME = ".summaryd-ship.json"
# Bytes read from a file at once, and so the most a checkpoint can lag behind the daemon.
_CHUNK_BYTES = 8 * 1024 * 1024
# Batches when the daemon states no limit.
_BATCH_EVENTS = 1024
_BATCH_BYTES = 1024 * 1024
# Errors after which the daemon is worth asking again (it is away, restarting, or shutting down).
_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)

# Errors of a write after which opening the session again may succeed.
_REOPEN = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE)

Progress = Callable[[int, int], None]


@dataclass
class ShipTotals:
    """What one shipper delivered: records and their bytes, files seen, records the daemon refused."""

    records: int = 0
    bytes: int = 0
    files: int = 0
    refused: int = 0
    waiting_bytes: int = 0
    error: str | None = None
    runs: set[str] = field(default_factory=set)

    def stopped_by(self, reason: str) -> None:
        """Shipping ended early because of `reason` (the first reason given is kept)."""
        self.error = self.error or reason

    def describe(self) -> str:
        """One line for the end of `summaryd ship`."""
        line = f"delivered {self.records} records ({self.bytes} bytes) from {self.files} files to {len(self.runs)} runs"
        if self.refused:
            line += f"; {self.refused} records refused by the daemon (see the log)"
        if self.waiting_bytes:
            line += f"; {self.waiting_bytes} bytes at file ends not whole records yet (shipped when they are)"
        if self.error:
            line += f"; stopped by: {self.error}"
        return line


class ShipError(RuntimeError):
    """The daemon answered a batch without acknowledging any of it (nor refusing one event of it)."""


def event_files(directory: Path, state_path: Path) -> list[Path]:
    """The `tfevents` files under `directory`, in path order (a writer's rotated files sort by their time)."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".summaryd"))
        found += [Path(root, name) for name in files if "tfevents" in name and Path(root, name) != state_path]
    return sorted(found)


def _is_file_version(record: bytes) -> bool:
    try:
        what: str | None = Event.FromString(record).WhichOneof("what")
    except DecodeError:
        return False
    return what == "file_version"


def whole_records(path: Path, offset: int) -> Iterator[tuple[bytes, int]]:
    """The whole records of `path` from `offset` on, each with the offset of its end, in chunks."""
    with open(path, "rb") as f:
        while True:
            f.seek(offset)
            data = f.read(_CHUNK_BYTES)
            records, _ = read_records(data)
            if not records and len(data) >= 8:
                # A record larger than a chunk: read it whole, when the file holds it whole.
                (length,) = struct.unpack_from("<Q", data)
                if _CHUNK_BYTES < length + FRAMING_BYTES <= os.fstat(f.fileno()).st_size - offset:
                    f.seek(offset)
                    records, _ = read_records(f.read(length + FRAMING_BYTES))
            if not records:
                return
            for record in records:
                offset += len(record) + FRAMING_BYTES
                yield record, offset


class Shipper:
    """Ships the event files under `directory` to runs below `run`, resuming from the checkpoint at `state_path`.

    Args:
        directory: where something writes event files.
        run: the run path the directory maps to under the daemon's logdir.
        address: daemon addresses, comma-separated (default `SUMMARYD_ADDRESS`, else `localhost:6065`); one
            that is away gives way to the next, one that names the run's owner sends the shipper there (when it
            is one of these or of `redirect_allow`).
        redirect_allow: daemons beyond `address` a redirect may lead to, comma-separated (default
            `SUMMARYD_REDIRECT_ALLOW`, else none); a redirect elsewhere is refused.
        channel_settings: token and TLS (default from `SUMMARYD_TOKEN`, `SUMMARYD_TLS_*`).
        state_path: the checkpoint (default `<directory>/.summaryd-ship.json`).
        rpc_timeout: deadline of each call.
        progress: called with the records and bytes delivered so far, after every batch.
    """

    def __init__(
        self,
        directory: Path,
        run: str,
        *,
        address: str | None = None,
        redirect_allow: str | None = None,
        channel_settings: ChannelSettings | None = None,
        state_path: Path | None = None,
        rpc_timeout: float = 10.0,
        progress: Progress | None = None,
    ) -> None:
        run_dir_parts(run, max_bytes=None, max_depth=None)
        self.directory = directory
        self.run = run.strip("/")
        self._daemons = DaemonChannel(
            resolve_addresses(address),
            channel_settings or ChannelSettings.from_environment(),
            resolve_redirect_allow(redirect_allow),
        )
        self.state_path = state_path or directory / STATE_NAME
        self.rpc_timeout = rpc_timeout
        self.totals = ShipTotals()
        self._progress = progress
        self._checkpoint = Checkpoint(self.state_path)
        # Sessions opened by this process (OpenSession answered): sent to directly, closed by `close()`.
        self._opened: dict[str, pb.OpenSessionResponse] = {}
        self._seen: set[str] = set()
        self._used: dict[str, float] = {}  # session id → when it was last opened or written to

    @property
    def address(self) -> str:
        """The daemon shipped to now."""
        return self._daemons.address

    # ---- passes ---------------------------------------------------------------------------------------------

    def ship_pass(self) -> int:
        """Ship every whole record the files hold now; return how many were delivered.

        Raises:
            grpc.RpcError: the daemon is away or refused a call; what was acknowledged is checkpointed.
        """
        delivered = 0
        waiting = 0
        for path in event_files(self.directory, self.state_path):
            name = path.relative_to(self.directory).as_posix()
            run = self._run_of(name)
            if run is None:
                continue
            cursor = self._checkpoint.cursor(name)
            if name not in self._seen:
                self._seen.add(name)
                self.totals.files += 1
                self.totals.runs.add(run)
            try:
                size = path.stat().st_size
                if size > cursor.offset:
                    delivered += self._ship_file(path, name, run, cursor)
            except FileNotFoundError:
                continue  # removed since the listing (a writer's cleanup): what was shipped stays shipped
            waiting += max(0, size - cursor.offset)
        self.totals.waiting_bytes = waiting
        return delivered

    def _run_of(self, name: str) -> str | None:
        parent = name.rpartition("/")[0]
        run = f"{self.run}/{parent}" if parent else self.run
        try:
            run_dir_parts(run, max_bytes=None, max_depth=None)
        except ValueError as exc:
            if name not in self._seen:
                self._seen.add(name)
                log.warning("not shipping %s: %s", name, exc)
            return None
        return run

    def _ship_file(self, path: Path, name: str, run: str, cursor: FileCursor) -> int:
        delivered = 0
        pending: list[tuple[bytes, int]] = []
        pending_bytes = 0
        for record, end in whole_records(path, cursor.offset):
            if cursor.offset == 0 and end == len(record) + FRAMING_BYTES and _is_file_version(record):
                cursor.advance(end)  # the daemon writes its own file_version record
                continue
            pending.append((record, end))
            pending_bytes += len(record)
            if pending_bytes >= _CHUNK_BYTES:
                delivered += self._send(name, run, cursor, pending)
                pending, pending_bytes = [], 0
        if pending:
            delivered += self._send(name, run, cursor, pending)
        return delivered

    # ---- sessions and batches -------------------------------------------------------------------------------

    def _open(self, name: str, run: str, cursor: FileCursor) -> tuple[pb.OpenSessionResponse, int]:
        """The file's session, opened (resumed) once per process; and how many records from the cursor on the
        daemon already holds in a session that was closed."""
        answer = self._opened.get(cursor.session_id)
        # A session quiet for half its lease may have been released by the daemon: opening it again resumes it.
        if answer is not None and time.monotonic() - self._used.get(cursor.session_id, 0.0) < answer.lease_seconds / 2:
            self._used[cursor.session_id] = time.monotonic()
            return answer, 0
        request = pb.OpenSessionRequest(
            session_id=cursor.session_id,
            run=run,
            client=pb.ClientIdentity(host=socket.gethostname(), pid=os.getpid(), framework="ship", version=VERSION),
            next_sequence=cursor.next_sequence,
            session_started=cursor.session_started,
        )
        held = 0
        try:
            answer = self._daemons.stub.OpenSession(request, timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or "was closed" not in (exc.details() or ""):
                raise
            # Closed by a shipper that died before it checkpointed the close. Closing again answers what the
            # daemon holds of it; the rest goes in a new session.
            closed = self._daemons.stub.CloseSession(
                pb.CloseSessionRequest(session_id=cursor.session_id), timeout=self.rpc_timeout
            )
            held = max(0, closed.acked_sequence - cursor.next_sequence + 1)
            cursor.renew()
            request.session_id, request.next_sequence = cursor.session_id, 1
            request.session_started = cursor.session_started
            answer = self._daemons.stub.OpenSession(request, timeout=self.rpc_timeout)
        self._opened[cursor.session_id] = answer
        self._used[cursor.session_id] = time.monotonic()
        return answer, held

    def _send(self, name: str, run: str, cursor: FileCursor, records: list[tuple[bytes, int]]) -> int:
        """Deliver `records` (each with its end offset) in the file's session; checkpoint what was acknowledged."""
        answer, held = self._open(name, run, cursor)
        last_end = records[-1][1]
        pending = self._past_held(cursor, records, held)
        delivered = 0
        reopened = False
        while pending:
            first = cursor.next_sequence
            try:
                acked, refused = self._write(cursor.session_id, first, [r for r, _ in pending], answer)
            except grpc.RpcError as exc:
                # The daemon restarted or released the session since this shipper opened it (NOT_FOUND, or
                # UNAVAILABLE "released"): open it again, once; it resumes where the daemon holds it. A daemon
                # that is really away fails that OpenSession.
                if reopened or exc.code() not in _REOPEN:
                    raise
                reopened = True
                self._opened.pop(cursor.session_id, None)
                answer, held = self._open(name, run, cursor)
                pending = self._past_held(cursor, pending, held)
                continue
            done = max(0, acked - first + 1)
            if done:
                delivered += done
                self.totals.records += done
                self.totals.bytes += sum(len(r) for r, _ in pending[:done])
                cursor.advance(pending[done - 1][1], acked + 1)
                pending = pending[done:]
            if refused is not None:
                # Nothing of the refusing batch was written: drop the refused record and number the rest anew.
                index = refused - cursor.next_sequence
                if 0 <= index < len(pending):
                    log.warning("the daemon refused a record of %s (%d bytes); skipped", name, len(pending[index][0]))
                    self.totals.refused += 1
                    del pending[index]
            elif done == 0 and pending:
                raise ShipError(f"the daemon acknowledged nothing of {name} at sequence {first}")
        cursor.advance(last_end)  # past a refused last record too
        self._checkpoint.save()
        if self._progress is not None:
            self._progress(self.totals.records, self.totals.bytes)
        return delivered

    @staticmethod
    def _past_held(cursor: FileCursor, records: list[tuple[bytes, int]], held: int) -> list[tuple[bytes, int]]:
        """`records` without the first `held`, which a closed session of this file already delivered.

        More than these cannot be held: a chunk is read from the checkpointed offset, and a checkpoint lags the
        daemon by at most the chunk sent last.
        """
        if held:
            cursor.advance(records[min(held, len(records)) - 1][1])
        return records[held:]

    def _write(
        self, session_id: str, first: int, events: Sequence[bytes], limits: pb.OpenSessionResponse
    ) -> tuple[int, int | None]:
        """Stream `events` numbered from `first`; return the acknowledged sequence and the refused one, if any."""
        max_events = limits.max_batch_events or _BATCH_EVENTS
        max_bytes = min(limits.max_message_bytes // 2 or _BATCH_BYTES, _BATCH_BYTES)

        def requests() -> Iterator[pb.WriteRequest]:
            batch: list[bytes] = []
            size = 0
            sequence = first
            for event in events:
                if batch and (len(batch) >= max_events or size + len(event) > max_bytes):
                    yield pb.WriteRequest(session_id=session_id, first_sequence=sequence, events=batch)
                    sequence += len(batch)
                    batch, size = [], 0
                batch.append(event)
                size += len(event)
            yield pb.WriteRequest(session_id=session_id, first_sequence=sequence, events=batch)

        acked = first - 1
        call = self._daemons.stub.Write(requests(), timeout=self.rpc_timeout + len(events) / 10_000)
        try:
            for ack in call:
                acked = max(acked, ack.acked_sequence)
        except grpc.RpcError as exc:
            refused = refused_sequence(exc)
            if exc.code() != grpc.StatusCode.INVALID_ARGUMENT or refused is None:
                raise
            return acked, refused
        return acked, None

    # ---- lifecycle ------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the sessions this shipper opened (the daemon syncs their records); their files continue in new
        sessions next time."""
        for name, cursor in list(self._checkpoint.files.items()):
            if cursor.session_id in self._opened:
                self._daemons.stub.CloseSession(
                    pb.CloseSessionRequest(session_id=cursor.session_id), timeout=self.rpc_timeout
                )
                self._checkpoint.files[name] = FileCursor.fresh(cursor.offset)
        self._opened.clear()
        self._checkpoint.save()
        self._daemons.close()

    def ship_once(self) -> ShipTotals:
        """Ship what the files hold, close the sessions, and return the totals.

        Raises:
            grpc.RpcError: the daemon is away or refused a call (what it acknowledged stays checkpointed).
            RedirectRefusedError: a daemon sent the shipper to an address it was not given.
        """
        self._ship_pass_anywhere()
        self.close()
        return self.totals

    def _ship_pass_anywhere(self) -> int:
        """`ship_pass` on the first daemon that takes it (the sessions open on one are opened again on the next:
        they resume where the daemon holds them)."""
        return self._daemons.call(lambda _: self.ship_pass(), moved=self._opened.clear)

    def follow(self, stop: threading.Event, poll_secs: float = 0.5) -> ShipTotals:
        """Ship new records every `poll_secs` until `stop` is set, then ship what is left and close.

        A daemon that is away, or that sends the shipper to an address it was not given (a lease in the
        bucket that names no daemon of the user's), is asked again on the next pass (with backoff); nothing is
        lost meanwhile, the files are the buffer.
        """
        backoff = poll_secs
        failing = False
        while True:
            stopping = stop.is_set()
            try:
                self._ship_pass_anywhere()
                if failing:
                    log.info("daemon at %s reachable again; shipping", self.address)
                failing, backoff = False, poll_secs
            except grpc.RpcError as exc:
                self._opened.clear()  # a restarted daemon knows the sessions only once they are opened again
                if exc.code() not in _TRANSIENT:
                    self.totals.error = f"{exc.code().name}: {exc.details()}"
                    raise
                if not failing:
                    log.warning("daemon at %s: %s; retrying", self.address, exc.code().name)
                failing, backoff = True, min(backoff * 2, 5.0)
                if stopping:
                    self.totals.error = f"{exc.code().name}: {exc.details()}"
                    return self.totals
            except RedirectRefusedError as exc:  # warned about by the channel, at a limited rate
                self._opened.clear()
                failing, backoff = True, min(backoff * 2, 5.0)
                if stopping:
                    self.totals.error = str(exc)
                    return self.totals
            if stopping:
                break
            stop.wait(backoff)
        self.close()
        return self.totals


def ship_until(stop: threading.Event, shipper: Shipper, poll_secs: float = 0.5) -> threading.Thread:
    """Run `shipper.follow` on a named background thread (for `summaryd run --ship`)."""

    def target() -> None:
        try:
            shipper.follow(stop, poll_secs)
        except Exception as exc:  # kept in the totals, which the caller reports
            shipper.totals.stopped_by(str(exc))
            log.error("shipper stopped: %s", exc)

    thread = threading.Thread(target=target, name="summaryd-ship", daemon=True)
    thread.start()
    return thread
