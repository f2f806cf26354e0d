"""`Shipper`: streams the records of event files that something else writes to the daemon, exactly once.

Each directory under the shipped directory that holds `tfevents` files is a run below the run root given
(`DIR/a/b/events...` goes to `<run>/a/b`). Every file is carried by its own session, whose id the checkpoint
keeps (`_ship_state`); its records are numbered 1, 2, ... in file order, so the daemon drops a record it
already holds when a restarted shipper (or a shipper talking to a restarted daemon) sends it again.

Records pass through as they are in the file: never parsed and encoded again, so the daemon's file holds the
same bytes. Only the file's first record, `file_version`, stays behind: the daemon writes its own. A record not
yet whole at the end of a file (its writer is still at it) waits for the next pass; a corrupt one stops the file
there, as it stops TensorBoard's reader, and is reported (`_record_reader`).

The checkpoint moves with what the daemon holds durably: on a bucket logdir its `durable_sequence` (uploaded),
not its acknowledgement (staged on that daemon only), so that a daemon lost with its disk loses nothing: the
next one resumes the session where the bucket has it and the shipper sends the rest again from its files. A
file is known by its device and inode: another file under a checkpointed name (rotation by rename, a restarted
writer), or one shorter than its checkpoint (truncated), is shipped from its start in a new session.
"""

from __future__ import annotations

import logging
import os
import socket
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
from summaryd.client._patch._record_reader import CHUNK_BYTES, Record, RecordReader
from summaryd.client._patch._ship_state import Checkpoint, FileCursor
from summaryd.client._sender._failover import DaemonChannel
from summaryd.client._sender._grpc_transport import refused_sequence
from summaryd.client._sender._targets import RedirectRefusedError
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1.runpath import run_dir_parts
from summaryd.v1.wire import FRAMING_BYTES, VERSION

log = logging.getLogger("summaryd.ship")

STATE_NAME = ".summaryd-ship.json"
# What is kept of a file's first bytes to tell it from another file written in its place.
_HEAD_BYTES = 32
# The largest event read when the daemon states no limit (its default --max-event-bytes).
_MAX_EVENT_BYTES = 16 * 1024 * 1024
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
    corrupt: int = 0
    oversized: int = 0
    restarted: int = 0
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
        if self.oversized:
            line += f"; {self.oversized} records over the daemon's largest event skipped (see the log)"
        if self.corrupt:
            line += f"; {self.corrupt} files stopped at a corrupt record, as TensorBoard's reader stops (see the log)"
        if self.restarted:
            line += f"; {self.restarted} files replaced or truncated since checkpointed, shipped from their start"
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


def _head(path: Path) -> str:
    """The first bytes of the file (its first record's header and the start of its `file_version`, which
    holds the writer's start time): a file rewritten from its start shows other ones."""
    try:
        with open(path, "rb") as f:
            return f.read(_HEAD_BYTES).hex()
    except FileNotFoundError:
        return ""


class _SessionMovedError(Exception):
    """The file's session stands elsewhere than the records being sent: read them again from the cursor."""


def _numbered(record: Record, cursor: FileCursor) -> bool:
    """Whether `record` has a sequence number in the cursor's session (not `file_version`, nor skipped)."""
    if record.start in cursor.skipped:
        return False
    return not (record.start == 0 and record.data is not None and _is_file_version(record.data))


def _position_of(path: Path, cursor: FileCursor, start: int, first: int, target: int) -> int | None:
    """Where the record numbered `target` of the cursor's session starts, counting from the record at `start`
    numbered `first`; None when the file does not reach it."""
    if first == target:
        return start
    sequence = first
    for record in RecordReader(path, _MAX_EVENT_BYTES).records(start):
        sequence += _numbered(record, cursor)
        if sequence == target:
            return record.end
    return None


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
        self._corrupt: dict[str, int] = {}  # file → the offset of the corrupt record it stops at

    @property
    def address(self) -> str:
        """The daemon shipped to now."""
        return self._daemons.address

    # ---- passes ---------------------------------------------------------------------------------------------

    def ship_pass(self) -> int:
        """Ship every whole record the files hold now; return how many were delivered.

        Raises:
            grpc.RpcError: the daemon is away or refused a call; what it holds durably is checkpointed.
        """
        before = self.totals.records
        waiting = 0
        found = {}
        for path in event_files(self.directory, self.state_path):
            try:
                found[path] = path.stat()
            except FileNotFoundError:
                continue  # removed since the listing (a writer's cleanup): what was shipped stays shipped
        displaced = self._displaced({path.relative_to(self.directory).as_posix(): st for path, st in found.items()})
        for path, stat in found.items():
            name = path.relative_to(self.directory).as_posix()
            run = self._run_of(name)
            if run is None:
                continue
            cursor = self._cursor(name, stat, _head(path), displaced)
            if name not in self._seen:
                self._seen.add(name)
                self.totals.files += 1
                self.totals.runs.add(run)
            try:
                if stat.st_size > cursor.read_offset:
                    self._ship_file(path, name, run, cursor)
                elif cursor.marks:
                    self._learn_durable(path, name, run, cursor)
            except FileNotFoundError:
                continue
            if name not in self._corrupt:
                waiting += max(0, stat.st_size - cursor.read_offset)
        self.totals.waiting_bytes = waiting
        return self.totals.records - before

    # ---- what a file is -------------------------------------------------------------------------------------

    def _displaced(self, stats: dict[str, os.stat_result]) -> dict[tuple[int, int], tuple[str, FileCursor]]:
        """The checkpointed files whose name now holds another file, or none: by what they are, so that one
        renamed (a rotation) carries on under its new name."""
        displaced = {}
        for name, cursor in list(self._checkpoint.files.items()):
            stat = stats.get(name)
            if cursor.inode and (stat is None or (stat.st_dev, stat.st_ino) != (cursor.device, cursor.inode)):
                displaced[(cursor.device, cursor.inode)] = (name, cursor)
        return displaced

    def _cursor(
        self, name: str, stat: os.stat_result, head: str, displaced: dict[tuple[int, int], tuple[str, FileCursor]]
    ) -> FileCursor:
        """The cursor of the file now at `name`: its own, the one it had under an earlier name in the same
        directory, or a new one (a new file, or another file in the place of the one checkpointed)."""
        files = self._checkpoint.files
        identity = (stat.st_dev, stat.st_ino)
        cursor = files.get(name)
        if cursor is not None and not cursor.inode:  # checkpointed before files were known by what they are
            cursor.device, cursor.inode = identity
        if cursor is not None and (cursor.device, cursor.inode) == identity:
            if stat.st_size < cursor.read_offset:
                why = f"is shorter ({stat.st_size} bytes) than when checkpointed ({cursor.read_offset}): truncated"
            elif head[: len(cursor.head)] != cursor.head:
                why = "begins with other bytes than when checkpointed: truncated and written again"
            else:
                cursor.head = head
                return cursor
        else:
            why = "holds another file than the one checkpointed"
        old = displaced.pop(identity, None)
        if cursor is None and old is not None and old[0].rpartition("/")[0] == name.rpartition("/")[0]:
            log.warning("%s is %s renamed: shipping it on from offset %d", name, old[0], old[1].read_offset)
            if files.get(old[0]) is old[1]:
                del files[old[0]]
            files[name] = old[1]
            return old[1]
        if cursor is not None:
            log.warning("%s %s; shipping it from its start in a new session", name, why)
            self.totals.restarted += 1
        files[name] = FileCursor.fresh(0, *identity)
        files[name].head = head
        return files[name]

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

    def _ship_file(self, path: Path, name: str, run: str, cursor: FileCursor) -> None:
        for _ in range(3):  # moved at most by each reopen of one pass
            try:
                answer, _ = self._open(path, name, run, cursor)
                self._ship_records(path, name, run, cursor, answer)
                return
            except _SessionMovedError:
                continue

    def _ship_records(
        self, path: Path, name: str, run: str, cursor: FileCursor, answer: pb.OpenSessionResponse
    ) -> None:
        reader = RecordReader(path, answer.max_event_bytes or _MAX_EVENT_BYTES)
        pending: list[Record] = []
        pending_bytes = 0
        for record in reader.records(cursor.read_offset):
            if record.data is None or (record.start == 0 and _is_file_version(record.data)):
                if pending:
                    answer = self._send(path, name, run, cursor, answer, pending)
                    pending, pending_bytes = [], 0
                if record.data is None:
                    log.warning(
                        "%s: the record at offset %d is of %d bytes, more than the daemon takes in an event (%d); "
                        "skipped",
                        name,
                        record.start,
                        record.end - record.start - FRAMING_BYTES,
                        reader.max_event_bytes,
                    )
                    self.totals.oversized += 1
                    cursor.skipped.append(record.start)
                cursor.acknowledged(record.end)  # the daemon writes its own file_version record
                cursor.durable_through(0 if record.start == 0 else -1)
                continue
            pending.append(record)
            pending_bytes += len(record.data)
            if pending_bytes >= CHUNK_BYTES:
                answer = self._send(path, name, run, cursor, answer, pending)
                pending, pending_bytes = [], 0
        if pending:
            self._send(path, name, run, cursor, answer, pending)
        if reader.corrupt is None:
            self._corrupt.pop(name, None)
        elif self._corrupt.get(name) != reader.corrupt[0]:
            self._corrupt[name] = reader.corrupt[0]
            self.totals.corrupt += 1
            log.warning(
                "%s: the record at offset %d cannot be read (%s); the file is shipped up to there, as far as "
                "TensorBoard's reader reads it",
                name,
                *reader.corrupt,
            )

    def _learn_durable(self, path: Path, name: str, run: str, cursor: FileCursor) -> None:
        """A file with nothing new whose records are acknowledged but not yet durable: a heartbeat's answer says
        how far the daemon has uploaded, and the checkpoint follows."""
        answer, _ = self._open(path, name, run, cursor)
        if not cursor.marks:
            return
        acked, durable, _ = self._write(cursor.session_id, cursor.read_next, [], answer)
        if cursor.durable_through(durable if answer.durable_acks else acked):
            self._checkpoint.save()

    # ---- sessions and batches -------------------------------------------------------------------------------

    def _open(self, path: Path, name: str, run: str, cursor: FileCursor) -> tuple[pb.OpenSessionResponse, bool]:
        """The file's session, opened (resumed) once per process; and whether the cursor moved to where the
        daemon holds it (another session, or records to send again)."""
        answer = self._opened.get(cursor.session_id)
        # A session quiet for half its lease may have been released by the daemon: opening it again resumes it.
        if answer is not None and time.monotonic() - self._used.get(cursor.session_id, 0.0) < answer.lease_seconds / 2:
            self._used[cursor.session_id] = time.monotonic()
            return answer, False
        request = pb.OpenSessionRequest(
            session_id=cursor.session_id,
            run=run,
            client=pb.ClientIdentity(host=socket.gethostname(), pid=os.getpid(), framework="ship", version=VERSION),
            next_sequence=cursor.next_sequence,
            session_started=cursor.session_started,
        )
        try:
            answer = self._daemons.stub.OpenSession(request, timeout=self.rpc_timeout)
            moved = self._resume_where_held(path, name, cursor, answer.last_sequence)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or "was closed" not in (exc.details() or ""):
                raise
            # Closed by a shipper that died before it checkpointed the close. Closing again answers what the
            # daemon holds of it; the rest goes in a new session.
            closed = self._daemons.stub.CloseSession(
                pb.CloseSessionRequest(session_id=cursor.session_id), timeout=self.rpc_timeout
            )
            offset = self._offset_of(path, name, cursor, closed.acked_sequence + 1)
            cursor.renew(offset)
            request.session_id, request.next_sequence = cursor.session_id, 1
            request.session_started = cursor.session_started
            answer = self._daemons.stub.OpenSession(request, timeout=self.rpc_timeout)
            moved = True
        self._opened[cursor.session_id] = answer
        self._used[cursor.session_id] = time.monotonic()
        cursor.durable_through(answer.durable_sequence if answer.durable_acks else answer.last_sequence)
        return answer, moved

    def _resume_where_held(self, path: Path, name: str, cursor: FileCursor, held: int) -> bool:
        """A daemon holding less of the session than this shipper had acknowledged (it lost what it had staged
        with its disk, or its state): send again from the record after `held`. Whether the cursor moved."""
        if held >= cursor.read_next - 1:
            return False
        offset = self._offset_of(path, name, cursor, held + 1)
        log.warning(
            "%s: the daemon holds its session through record %d of the %d acknowledged; sending again from offset %d",
            name,
            held,
            cursor.read_next - 1,
            offset,
        )
        cursor.reset_to(offset, held + 1)
        return True

    @staticmethod
    def _offset_of(path: Path, name: str, cursor: FileCursor, target: int) -> int:
        """Where the record numbered `target` of the cursor's session starts.

        Raises:
            ShipError: the file does not reach it (it is not the file the session carried).
        """
        if target >= cursor.next_sequence:
            offset = _position_of(path, cursor, cursor.offset, cursor.next_sequence, target)
        else:
            offset = _position_of(path, cursor, cursor.session_offset, 1, target)
        if offset is None:
            raise ShipError(f"{name} does not hold record {target} of its session {cursor.session_id}")
        return offset

    def _send(
        self,
        path: Path,
        name: str,
        run: str,
        cursor: FileCursor,
        answer: pb.OpenSessionResponse,
        records: list[Record],
    ) -> pb.OpenSessionResponse:
        """Deliver `records` in the file's session; checkpoint what the daemon holds durably. Returns the
        session's answer (another one when it was opened again).

        Raises:
            _SessionMovedError: opened again, the session stands elsewhere than these records.
        """
        pending = records
        reopened = False
        while pending:
            first = cursor.read_next
            try:
                acked, durable, refused = self._write(
                    cursor.session_id, first, [r.data or b"" for r in pending], answer
                )
            except grpc.RpcError as exc:
                # The daemon restarted or released the session since this shipper opened it (NOT_FOUND, or
                # UNAVAILABLE "released"): open it again, once; it resumes where the daemon holds it. A daemon
                # that is really away fails that OpenSession.
                if reopened or exc.code() not in _REOPEN:
                    raise
                reopened = True
                self._opened.pop(cursor.session_id, None)
                answer, moved = self._open(path, name, run, cursor)
                if moved:
                    raise _SessionMovedError from None
                continue
            done = max(0, acked - first + 1)
            if done:
                self.totals.records += done
                self.totals.bytes += sum(len(r.data or b"") for r in pending[:done])
                cursor.acknowledged(pending[done - 1].end, acked + 1)
                pending = pending[done:]
            cursor.durable_through(durable if answer.durable_acks else acked)
            if refused is not None:
                # Nothing of the refusing batch was written: drop the refused record and number the rest anew.
                index = refused - cursor.read_next
                if 0 <= index < len(pending):
                    log.warning(
                        "the daemon refused a record of %s (%d bytes); skipped", name, len(pending[index].data or b"")
                    )
                    self.totals.refused += 1
                    cursor.skipped.append(pending[index].start)
                    del pending[index]
            elif done == 0 and pending:
                raise ShipError(f"the daemon acknowledged nothing of {name} at sequence {first}")
        cursor.acknowledged(records[-1].end)  # past a refused last record too
        self._checkpoint.save()
        if self._progress is not None:
            self._progress(self.totals.records, self.totals.bytes)
        return answer

    def _write(
        self, session_id: str, first: int, events: Sequence[bytes], limits: pb.OpenSessionResponse
    ) -> tuple[int, int, int | None]:
        """Stream `events` numbered from `first`; return the acknowledged and durable sequence numbers and the
        refused one, if any."""
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

        acked, durable = first - 1, 0
        call = self._daemons.stub.Write(requests(), timeout=self.rpc_timeout + len(events) / 10_000)
        try:
            for ack in call:
                acked, durable = max(acked, ack.acked_sequence), max(durable, ack.durable_sequence)
        except grpc.RpcError as exc:
            refused = refused_sequence(exc)
            if exc.code() != grpc.StatusCode.INVALID_ARGUMENT or refused is None:
                raise
            return acked, durable, refused
        return acked, durable, None

    # ---- lifecycle ------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the sessions this shipper opened (the daemon syncs their records); their files continue in new
        sessions next time."""
        for name, cursor in list(self._checkpoint.files.items()):
            if cursor.session_id in self._opened:
                self._daemons.stub.CloseSession(
                    pb.CloseSessionRequest(session_id=cursor.session_id), timeout=self.rpc_timeout
                )
                self._checkpoint.files[name] = cursor.successor()
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
