"""`Sender`: the caller's side, and the whole sender's public face."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import grpc

from summaryd.client import _process
from summaryd.client._channel import ChannelSettings
from summaryd.client._environment import resolve_address
from summaryd.client._sender._items import EventSource, Queued
from summaryd.client._sender._report import DeliveryReport
from summaryd.client._sender._state import OVERFLOW_POLICIES, Overflow, log
from summaryd.client._sender._thread import SenderThread
from summaryd.client._spool import default_root
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.runpath import run_dir_parts

# Share of `close(timeout)` kept for spooling what the daemon did not acknowledge (at most a second).
_SPOOL_RESERVE = 0.2


class Sender(SenderThread):
    """Ships the events of one session (one run directory) to the daemon in the background.

    Args:
        run: run path under the daemon's logdir.
        address: `host:port` of the daemon (`host` alone: port 6065); default `SUMMARYD_ADDRESS`, else
            `localhost:6065`.
        worker: worker label; the events land in `<run>/<worker>`. Empty for a single process.
        world_size: number of workers of the job (shown in status).
        max_queue_bytes: bound of the events held in memory (queued and unacknowledged), in estimated bytes.
        max_batch_events, max_batch_bytes: the largest batch sent at once.
        linger_secs: how long a partial batch waits for more events before it is sent.
        rpc_timeout: deadline of each call, and how long a sent batch may wait for its ack.
        max_in_flight: batches sent but not yet acknowledged.
        close_timeout: default of `close(timeout=...)`, also used at interpreter exit and on SIGTERM.
        overflow: what happens when memory runs over `max_queue_bytes`: `spill` the oldest events to the spool
            (the default; nothing is lost while the local disk takes it), `drop_oldest` queued events, or
            `block` the caller until there is room (at most `block_secs`, then the new event is dropped).
        spool_dir: spool root; default `SUMMARYD_SPOOL_DIR`, else `~/.cache/summaryd/spool`. None disables
            spooling when given as `spool=False`.
        spool: whether events may be spooled at all.
        spool_after: seconds without any acknowledgement (daemon away or stuck) after which unacknowledged
            events are moved to the spool, where they survive this process.
        heartbeat_secs: longest silence on the stream; the daemon releases sessions it does not hear from.
    """

    def __init__(
        self,
        run: str,
        *,
        address: str | None = None,
        worker: str = "",
        world_size: int = 1,
        framework: str = "summaryd",
        max_queue_bytes: int = 64 * 1024 * 1024,
        max_batch_events: int = 1024,
        max_batch_bytes: int = 1024 * 1024,
        linger_secs: float = 0.05,
        rpc_timeout: float = 10.0,
        max_in_flight: int = 8,
        backoff_secs: tuple[float, float] = (0.05, 2.0),
        close_timeout: float = 5.0,
        overflow: Overflow = "spill",
        block_secs: float | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        spool: bool = True,
        spool_after: float = 10.0,
        heartbeat_secs: float = 10.0,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow={overflow!r}: choose one of {', '.join(OVERFLOW_POLICIES)}")
        # A run path or worker label the daemon would refuse fails here, where the caller sees it, instead of
        # every event being dropped later on the sender thread. The daemon's length and depth limits are its
        # configuration; it alone checks them.
        run_dir_parts(run, worker, max_bytes=None, max_depth=None)
        self.run = run
        self.address = resolve_address(address)
        # Token and TLS: arguments, else SUMMARYD_TOKEN / SUMMARYD_TLS_*; checked here, not on the sender thread.
        self.channel_settings = ChannelSettings.from_environment(
            token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
        )
        self.worker = worker
        self.world_size = world_size
        self.framework = framework
        self.max_queue_bytes = max_queue_bytes
        self.max_batch_events = max_batch_events
        self.max_batch_bytes = max_batch_bytes
        self.linger_secs = linger_secs
        self.rpc_timeout = rpc_timeout
        self.max_in_flight = max_in_flight
        self.backoff_secs = backoff_secs
        self.close_timeout = close_timeout
        self.overflow: Overflow = overflow if spool or overflow != "spill" else "drop_oldest"
        self.block_secs = block_secs
        self.spool_root = Path(spool_dir) if spool_dir is not None else default_root()
        self.spool_enabled = spool
        self.spool_after = spool_after
        self.heartbeat_secs = heartbeat_secs
        self._init_state()
        _process.register(self)

    @property
    def unreachable(self) -> bool:
        """Whether the last attempt to open the session failed: the daemon is away (or refused it)."""
        return self._connect_failed

    def owned_here(self) -> bool:
        return self._pid == _process.pid

    def pause_for_fork(self, timeout: float) -> bool:
        return self._encoding.acquire(timeout=timeout)

    def resume_after_fork(self) -> None:
        self._encoding.release()

    def forget_parent_after_fork(self) -> None:
        """In a forked child: leave the parent's session, stream and spool alone and start afresh."""
        if self.owned_here():
            return
        if self._spool is not None:
            self._spool.forget()
        _process.keep_forever(self._channel, self._stream, self._opening)
        self._init_state()

    def submit(self, source: EventSource, nbytes: int = 64) -> bool:
        """Queue one event without blocking (unless `overflow="block"`); False when it was dropped (counted)."""
        return self.enqueue((source, nbytes))

    def enqueue(self, item: Queued) -> bool:
        """Queue `(source, estimated bytes)`, or the plain values of an event the sender thread builds (see
        `_encoder`). As `submit` otherwise."""
        # The caller's hot path: every call here is inlined where it could be (a Python call costs the caller
        # most right after its thread slept, the usual case in training).
        if self._pid != _process.pid:  # forked: see `_process`
            self.forget_parent_after_fork()
        # The condition's own lock, taken directly: `with self._cond` would add a Python-level call.
        with self._lock:
            if self._closing or self._failed is not None:
                self._dropped["closed" if self._closing else "rejected"] += 1
                return False
            nbytes: int = item[-1]
            over = self._queued_bytes + self._held_bytes + max(nbytes, self._room_wanted) > self.max_queue_bytes
            if over and not self._make_room(nbytes):
                self._dropped["queue_full"] += 1
                self._warn("queue_full", f"queue full ({self.max_queue_bytes} bytes): dropping events of {self.run!r}")
                return False
            # The first event of a new batch wakes the sender, which may be asleep for up to a heartbeat
            # interval, so that the batch leaves within `linger_secs` of it; later ones only when it is full.
            wake = not self._queue
            if wake:
                self._queued_at = time.monotonic()
                if not self._log:
                    self._progress_at = self._queued_at
            self._queue.append(item)
            before = self._queued_bytes
            self._queued_bytes = queued = before + nbytes
            self._accepted += 1
            # Wake it once as a batch fills up, not at every event after: a caller that outruns the sender
            # would otherwise pay for a wake-up (and a fight for the GIL) per event.
            wake = wake or len(self._queue) == self.max_batch_events
            wake = wake or before < self.max_batch_bytes <= queued
            held = self._held_bytes
            wake = wake or before + held <= self.max_queue_bytes < queued + held
        if self._thread is None:
            self._start()
        elif wake:
            self._wake.set()
        return True

    def _make_room(self, nbytes: int) -> bool:
        """Apply the overflow policy for an event of `nbytes`; False when it must be dropped. Holds the lock."""
        if not self._over_budget(nbytes):
            return True
        if self.overflow == "spill" and self._spool_error is None:
            # The sender thread spills to disk; only events it has not even serialized yet are waited for,
            # i.e. the caller slows down only when it outruns this machine's own encoding and disk.
            self._room_wanted = nbytes
            try:
                while self._queued_bytes + nbytes > self.max_queue_bytes and self._sender_alive():
                    self._wake.set()
                    self._cond.wait(0.05)
                    if self._spool_error is not None:
                        break
            finally:
                self._room_wanted = 0
            if self._spool_error is None:
                return True
        if self.overflow == "block":
            deadline = None if self.block_secs is None else time.monotonic() + self.block_secs
            self._room_wanted = nbytes
            try:
                while self._over_budget(nbytes) and self._sender_alive() and not self._closing:
                    remaining = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
                    if remaining <= 0:
                        return False
                    self._wake.set()
                    self._cond.wait(remaining)
            finally:
                self._room_wanted = 0
            return True
        # drop_oldest (also `spill` once the spool failed): make room from the head of the queue.
        dropped = 0
        while self._queue and self._over_budget(nbytes):
            self._queued_bytes -= self._queue.popleft()[-1]
            self._settled += 1
            dropped += 1
        if dropped:
            self._dropped["queue_full"] += dropped
            self._warn("queue_full", f"queue over {self.max_queue_bytes} bytes: dropping the oldest of {self.run!r}")
        return True

    def report(self) -> DeliveryReport:
        """The counts as of now."""
        with self._lock:
            return DeliveryReport(
                delivered=self._delivered,
                undelivered=self._accepted - self._settled,
                dropped=dict(self._dropped),
                synced=self._synced,
                error=self._failed or self._last_error,
                spooled=self._spooled,
                spool_path=str(self._spool.directory) if self._spool is not None and self._spooled else None,
            )

    def flush(self, timeout: float | None = None, *, durable: bool = False) -> DeliveryReport:
        """Wait until everything submitted so far is acknowledged (visible in the event file).

        With `durable`, also ask the daemon to fsync the run's file. Never raises; the report says what is
        still undelivered when the timeout ran out.
        """
        deadline = time.monotonic() + (self.rpc_timeout if timeout is None else timeout)
        with self._cond:
            target = self._accepted
            if self._thread is None and target > self._settled:
                return self.report()
        self._wake.set()
        with self._cond:
            while self._settled + (self._spooled if self._outbox_pid else 0) < target and self._failed is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._sender_alive():
                    break
                self._cond.wait(min(remaining, 0.1))
            done = self._settled >= target
        channel = self._channel
        if durable and done and channel is not None:
            try:
                pb_grpc.SummariesStub(channel).Flush(
                    pb.FlushRequest(session_id=self.session_id, durable=True),
                    timeout=max(0.01, deadline - time.monotonic()),
                )
            except (grpc.RpcError, ValueError) as exc:
                self._note_error(exc)
        return self.report()

    def begin_close(self, deadline: float) -> None:
        """Stop taking events and start delivering the rest; `close()` waits for it."""
        with self._cond:
            if not self._closing:
                self._closing = True
                self._close_deadline = deadline
            self._cond.notify_all()
        self._wake.set()

    def close(self, timeout: float | None = None) -> DeliveryReport:
        """Deliver what is queued, have the daemon fsync it and release the session; safe to call twice.

        Returns within about `timeout` seconds (default `close_timeout`) whatever the daemon does. What the
        daemon did not acknowledge by then is in the spool (`report.spooled`, `report.spool_path`) unless
        spooling is off or failed; the rest is counted as dropped (`timeout`).
        """
        if not self.owned_here():
            self.forget_parent_after_fork()
        timeout = self.close_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._closed:
                return self.report()
            deadline = min(deadline, self._close_deadline)
        self.begin_close(deadline)
        thread = self._thread
        if thread is not None:
            # Deliver until shortly before the deadline, then spool what is left, then stop.
            reserve = min(1.0, timeout * _SPOOL_RESERVE) if self._can_spool() else 0.0
            thread.join(max(0.0, deadline - reserve - time.monotonic()))
            if thread.is_alive():
                with self._cond:
                    self._spill_all = True
                self._wake.set()
                thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                self._abandon.set()
                self._wake.set()
                stream = self._stream
                if stream is not None:
                    stream.call.cancel()
                thread.join(1.0)
        return self._closed_report()

    def _closed_report(self) -> DeliveryReport:
        with self._cond:
            self._closed = True
            undelivered = self._accepted - self._settled
            unsafe = undelivered - self._spooled
            if unsafe > 0:
                self._dropped["timeout"] += unsafe
                self._settled += unsafe
                log.warning(
                    "summaryd: %d events for run %r were not delivered to %s (%s)",
                    unsafe,
                    self.run,
                    self.address,
                    self._failed or self._last_error or "timed out",
                )
            report = dataclasses.replace(self.report(), undelivered=undelivered)
        if report.spooled and self._outbox_pid is not None:
            log.debug("summaryd: %d events of run %r left to process %d", report.spooled, self.run, self._outbox_pid)
        elif report.spooled:
            log.warning(
                "summaryd: %d events of run %r were not delivered; they are in the spool %s (see `summaryd replay`)",
                report.spooled,
                self.run,
                report.spool_path,
            )
        _process.unregister(self)
        return report
