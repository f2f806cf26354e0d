"""`Sender`: the caller's side, and the face of the parts behind it."""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from summaryd.client._options import ClientOptions, carried_or_made
from summaryd.client._process import _exit, _fork
from summaryd.client._sender._connection import Connection
from summaryd.client._sender._core import SenderCore
from summaryd.client._sender._grpc_transport import GrpcTransport
from summaryd.client._sender._items import FAST_ITEM_BYTES, EventSource, Queued
from summaryd.client._sender._kinds import SOURCE
from summaryd.client._sender._loop import SenderLoop
from summaryd.client._sender._report import DeliveryReport
from summaryd.client._sender._spiller import Spiller
from summaryd.client._sender._status import log
from summaryd.client._sender._transport import Transport
from summaryd.client._spool import SpoolIdentity
from summaryd.v1.runpath import run_dir_parts

# Share of `close(timeout)` kept for spooling what the daemon did not acknowledge (at most a second).
_SPOOL_RESERVE = 0.2


class Sender:
    """Ships the events of one session (one run directory) to the daemon in the background.

    Args:
        run: run path under the daemon's logdir.
        address: `host:port` of the daemon (`host` alone: port 6065); default `SUMMARYD_ADDRESS`, else
            `localhost:6065`.
        worker: worker label; the events land in `<run>/<worker>`. Empty for a single process.
        world_size: number of workers of the job (shown in status).
        aggregate: whether the daemon aggregates this session's scalars across the job's workers, or the tag
            patterns it aggregates (see `SummaryWriter`).
        framework: what logs (shown in status).
        options: the client's settings, made once (`ClientOptions.make`) and shared by the senders of a writer;
            when given, `address` and `settings` must not be.
        transport: makes the connection to the daemon from the options (default gRPC; tests give a fake).
        settings: the other arguments of `ClientOptions.make`: `token`, `tls_*`, `max_queue_bytes`,
            `max_batch_events`, `max_batch_bytes`, `linger_secs`, `rpc_timeout`, `max_in_flight`,
            `close_timeout`, `overflow`, `block_secs`, `spool_dir`, `spool`, `spool_after`, `heartbeat_secs`.

    Raises:
        ValueError: a run path or worker label the daemon refuses, or settings it cannot use.
    """

    def __init__(
        self,
        run: str,
        *,
        address: str | None = None,
        worker: str = "",
        world_size: int = 1,
        framework: str = "summaryd",
        aggregate: bool | tuple[str, ...] = True,
        options: ClientOptions | None = None,
        transport: Callable[[ClientOptions], Transport] = GrpcTransport,
        **settings: Any,
    ) -> None:
        options = carried_or_made(options, address, settings)
        # A run path or worker label the daemon would refuse fails here, where the caller sees it, instead of
        # every event being dropped later on the sender thread. The daemon's length and depth limits are its
        # configuration; it alone checks them.
        run_dir_parts(run, worker, max_bytes=None, max_depth=None)
        self.options = options
        # Read on the caller's hot path: plain attributes, one lookup each.
        self.max_batch_events = options.max_batch_events
        self._max_batch_bytes = options.max_batch_bytes
        self.run = run
        self.worker = worker
        self.world_size = world_size
        self.framework = framework
        self.aggregate = aggregate
        self._transport = transport
        self._init_state()
        _exit.register(self)

    def _init_state(self) -> None:
        """Everything that belongs to one process; a forked child builds it anew (never the parent's channel)."""
        options = self.options
        self._pid = os.getpid()
        # In a child forked from a process that used gRPC: never use gRPC, write to an outbox instead.
        self._outbox_pid = _fork.outbox_owner()
        # Sent when opening the session: a daemon that lost state refuses to resume sessions older than the loss.
        self.identity = SpoolIdentity(
            str(uuid.uuid4()),
            self.run,
            self.worker,
            self.world_size,
            options.address,
            self.framework,
            session_started=time.time(),
            aggregate=self.aggregate,
            addresses=options.addresses,
            redirect_allow=options.redirect_allow,
        )
        core = SenderCore.make(options, self.identity, self._outbox_pid)
        # The caller's side reads these on every call: plain attributes, one lookup each.
        self._lock, self._cond, self._wake, self._abandon = core.lock, core.cond, core.wake, core.abandon
        self._encoding = core.encoding
        self._queue, self._ledger, self._batches = core.queue, core.ledger, core.batches
        self._status, self._budget = core.status, core.budget
        # The queue, public for `SummaryWriter.add_scalar`, which inlines `enqueue`'s lock-free append.
        self.queue = core.queue
        # What takes the events logged after close() (see `hand_over_after_close`); None: they are dropped.
        self._successor: Callable[[], Sender] | None = None
        self._spiller = Spiller(core)
        self._connection = Connection(core, self._transport(options), self._spiller)
        self._loop = SenderLoop(core, self._spiller, self._connection)

    @property
    def address(self) -> str:
        """The daemon talked to now: the first of the options' addresses until the sender fails over or is sent
        to the run's owner."""
        return self._connection.address

    @property
    def session_id(self) -> str:
        return self.identity.session_id

    @property
    def run_dir(self) -> str | None:
        """The run's directory on the daemon, once a session opened."""
        return self._connection.run_dir

    @property
    def unreachable(self) -> bool:
        """Whether the last attempt to open the session failed: the daemon is away (or refused it)."""
        return self._connection.connect_failed

    def owned_here(self) -> bool:
        return self._pid == _fork.pid

    def pause_for_fork(self, timeout: float) -> bool:
        return self._encoding.acquire(timeout=timeout)

    def resume_after_fork(self) -> None:
        self._encoding.release()

    def forget_parent_after_fork(self) -> None:
        """In a forked child: leave the parent's session, stream and spool alone and start afresh."""
        if self.owned_here():
            return
        self._spiller.leave_to_parent()
        self._connection.leave_to_parent()
        self._init_state()

    def start(self) -> None:
        """Start the sender thread (the first event does), e.g. to open the session before any event."""
        self._loop.start()

    def open_after(self, predecessor: Sender) -> None:
        """Open this sender's session only once `predecessor` (closing, of the same run) has ended: the events of
        a writer reopened after `close()` land after those it closed with. Logging meanwhile queues as usual."""
        self._loop.after = predecessor._loop

    def hand_over_after_close(self, successor: Callable[[], Sender]) -> None:
        """Once closed, pass each event queued here to the sender `successor()` returns instead of dropping it
        (a writer that reopens on use, as torch's does after `close()`)."""
        with self._lock:
            self._successor = successor

    def submit(self, source: EventSource, nbytes: int = 64) -> bool:
        """Queue one event without blocking (unless `overflow="block"`); False when it was dropped (counted)."""
        return self.enqueue((SOURCE, source, nbytes))

    def enqueue(self, item: Queued) -> bool:
        """Queue `(SOURCE, source, estimated bytes)`, or the plain values of an event the sender thread builds
        (`_items.Queued`, `_encoder`). As `submit` otherwise."""
        # The caller's hot path: a small event is one append without the lock, and one comparison after it (why
        # that is safe: `EventQueue`, and DESIGN.md); the rest takes the lock (`appended`, `_enqueue_locked`).
        # No fork check here: in a forked child every registered sender starts afresh (`_process`), with no
        # lock-free room, and a closed one has none either, so a child's first event always calls in, and the
        # locked path checks.
        if item[-1] > FAST_ITEM_BYTES:
            return self._enqueue_locked(item)
        queue = self._queue
        inbox = queue.inbox
        inbox.append(item)
        queued = len(inbox)
        return queued < queue.alert or self.appended(item, queued)

    def appended(self, item: Queued, queued: int) -> bool:
        """After the lock-free append of `item` left `queued` events in the queue, at least its `alert`: what the
        caller does next (`SummaryWriter.add_scalar` inlines the append and calls this only then)."""
        successor: Callable[[], Sender] | None = None
        with self._lock:
            queue, status = self._queue, self._status
            # Read after the append: a sender that stops accepting sets this first, then drains the queue under the
            # lock; an event appended after its last look is taken back here and refused (or handed on), never
            # left behind uncounted. If the sender took it already, it is accounted like any other.
            if not status.accepting:
                if not queue.take_back(item):
                    return True
                successor = self._successor if status.closing else None
                if successor is None:
                    self._ledger.refuse("closed" if status.closing else "rejected")
                    return False
                again = wake = False
            elif queued > queue.fast_until:
                # Past the lock-free room (or a forked child's first event): queued again under the lock, by the
                # overflow policy, unless the sender took it already (then it is one event past the room, which
                # the bound allows each logging thread).
                again, wake = queue.take_back(item), False
            else:
                again, wake = False, queued >= queue.wake_at
                if wake:
                    if queued == 1:  # the first of a batch: the linger clock starts
                        now = time.monotonic()
                        self._batches.nothing_pending(now)
                        queue.queued_at = now
                    queue.disarm()  # once: the sender looks at the queue before it waits again
        if successor is not None:
            return successor().enqueue(item)
        if again:
            return self._enqueue_locked(item)
        if wake:
            self._wake.set()
        return True

    def _enqueue_locked(self, item: Queued) -> bool:
        """`enqueue` under the lock: a large event, no room for more without a look at the budget, or no
        sender thread yet. Applies the overflow policy, wakes the sender and opens the lock-free path again."""
        if self._pid != _fork.pid:  # forked: see `_process`
            self.forget_parent_after_fork()
        queue = self._queue
        with self._lock:
            status = self._status
            if not status.accepting:
                if status.closing and self._successor is not None:
                    return self._successor().enqueue(item)
                self._ledger.refuse("closed" if status.closing else "rejected")
                return False
            nbytes: int = item[-1]
            budget = self._budget
            if budget.over(nbytes) and not self._make_room(nbytes):
                self._ledger.refuse("queue_full")
                status.warnings.warn(
                    "queue_full", f"queue full ({budget.limit} bytes): dropping events of {self.run!r}"
                )
                return False
            room = budget.room()  # after any wait for room: the lock was let go meanwhile
            before = queue.nbytes
            items = queue.items
            # The first event of a new batch wakes the sender, which may be asleep for up to a heartbeat
            # interval, so that the batch leaves within `linger_secs` of it; later ones only when it is full.
            wake = not items
            if wake:
                now = time.monotonic()
                self._batches.nothing_pending(now)
                queue.queued_at = now
            queue.append(item)
            if not wake:
                wake = (
                    len(items) == self.max_batch_events
                    or before < self._max_batch_bytes <= before + nbytes
                    or 0 <= room < nbytes  # this event takes memory over the bound: the sender thread spills
                )
            started = self._loop.started
            if started:  # the sender thread is there to take what callers append without the lock
                budget.open_fast(status.accepting)
        if not started:
            self._loop.start()
        elif wake:
            self._wake.set()
        return True

    def _make_room(self, nbytes: int) -> bool:
        """Apply the overflow policy for an event of `nbytes`; False when it must be dropped. Holds the lock."""
        options, queue, budget = self.options, self._queue, self._budget
        if not budget.over(nbytes):
            return True
        if options.overflow == "spill" and self._spiller.error is None:
            # The sender thread spills to disk; only events it has not even serialized yet are waited for,
            # i.e. the caller slows down only when it outruns this machine's own encoding and disk.
            queue.want_room(nbytes)
            try:
                while budget.over(nbytes, queue_only=True) and self._loop.alive():
                    self._wake.set()
                    self._cond.wait(0.05)
                    if self._spiller.error is not None:
                        break
            finally:
                queue.want_room(0)
            if self._spiller.error is None:
                return True
        if options.overflow == "block":
            deadline = None if options.block_secs is None else time.monotonic() + options.block_secs
            queue.want_room(nbytes)
            try:
                while budget.over(nbytes) and self._loop.alive() and not self._status.closing:
                    remaining = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
                    if remaining <= 0:
                        return False
                    self._wake.set()
                    self._cond.wait(remaining)
            finally:
                queue.want_room(0)
            return True
        # drop_oldest (also `spill` once the spool failed): make room from the head of the queue.
        dropped = 0
        while queue.items and budget.over(nbytes):
            queue.drop_oldest()
            dropped += 1
        if dropped:
            self._ledger.settle(dropped, "queue_full")
            self._status.warnings.warn(
                "queue_full", f"queue over {options.max_queue_bytes} bytes: dropping the oldest of {self.run!r}"
            )
        return True

    def report(self) -> DeliveryReport:
        """The counts as of now."""
        with self._lock:
            return self._ledger.report(
                synced=self._status.synced, error=self._status.error, spool_path=self._spiller.path
            )

    def send_now(self) -> DeliveryReport:
        """Have the sender thread send everything queued so far at once (no linger), without waiting for it; the
        counts as of now. What a framework's `flush()` after every logged step costs: a lock, and a wake-up
        unless an earlier flush's events are still queued (the sender thread is on its way for them then, and
        takes these with them: one message per flush gap, `_loop.FLUSH_GAP_SECS`, however often the loop
        flushes)."""
        with self._lock:
            queue = self._queue
            asked = queue.taken < queue.send_now_until
            queue.send_now_until = queue.accepted
            report = self.report()
        if not asked:
            self._wake.set()
        return report

    def flush(self, timeout: float | None = None, *, durable: bool = False) -> DeliveryReport:
        """Wait until everything submitted so far is acknowledged (visible in the event file).

        With `durable`, also ask the daemon to fsync the run's file. Never raises; the report says what is
        still undelivered when the timeout ran out.
        """
        deadline = time.monotonic() + (self.options.rpc_timeout if timeout is None else timeout)
        ledger = self._ledger
        with self._cond:
            target = ledger.accepted
            self._queue.send_now_until = self._queue.accepted
            if not self._loop.started and target > ledger.settled:
                return self.report()
        self._wake.set()
        with self._cond:
            # In a forked child, events in the outbox are as good as delivered: the parent's courier sends them.
            while ledger.settled + (ledger.spooled if self._outbox_pid else 0) < target and self._status.failed is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._loop.alive():
                    break
                self._cond.wait(min(remaining, 0.1))
            done = ledger.settled >= target
        if durable and done:
            self._connection.flush(max(0.01, deadline - time.monotonic()))
        return self.report()

    def begin_close(self, deadline: float) -> None:
        """Stop taking events and start delivering the rest by `deadline`, in the background: the thread ends by
        then (what is not delivered spooled), and the process's exit waits for it; `close()` waits for it too."""
        with self._cond:
            first = not self._status.closing
            self._status.begin_close(deadline)
            self._queue.stop_taking()  # callers call in, and see that it no longer accepts
            self._cond.notify_all()
        self._wake.set()
        if first:
            _exit.keep_until_closed(self)

    def done(self) -> bool:
        """Whether it is closing and its thread has ended: nothing is left for `close()` to wait for."""
        return self._status.closing and not self._loop.alive()

    def close(self, timeout: float | None = None) -> DeliveryReport:
        """Deliver what is queued, have the daemon fsync it and release the session; safe to call twice.

        Returns within about `timeout` seconds (default `close_timeout`) whatever the daemon does. What the
        daemon did not acknowledge by then is in the spool (`report.spooled`, `report.spool_path`) unless
        spooling is off or failed; the rest is counted as dropped (`timeout`).
        """
        if not self.owned_here():
            self.forget_parent_after_fork()
        timeout = self.options.close_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._status.closed:
                return self.report()
            deadline = min(deadline, self._status.close_deadline)
        self.begin_close(deadline)
        loop = self._loop
        if loop.started:
            # Deliver until shortly before the deadline, then spool what is left, then stop.
            reserve = min(1.0, timeout * _SPOOL_RESERVE) if self._spiller.can_spool() else 0.0
            if not loop.join(max(0.0, deadline - reserve - time.monotonic())):
                with self._cond:
                    self._status.spill_everything()
                self._wake.set()
                loop.join(max(0.0, deadline - time.monotonic()))
            if loop.alive():
                self._abandon.set()
                self._wake.set()
                self._connection.cancel()
                loop.join(1.0)
        return self._closed_report()

    def _closed_report(self) -> DeliveryReport:
        ledger = self._ledger
        with self._cond:
            self._status.finish_close()
            # Events still queued are taken off (counted as accepted, settled below): a caller that appended one
            # after the sender's last look then finds it gone, and does not count it again (`_appended_while_closed`).
            self._queue.clear()
            undelivered = ledger.unsettled
            unsafe = undelivered - ledger.spooled
            if unsafe > 0:
                ledger.settle(unsafe, "timeout")
                log.warning(
                    "summaryd: %d events for run %r were not delivered to %s (%s)",
                    unsafe,
                    self.run,
                    self.address,
                    self._status.error or "timed out",
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
        _exit.unregister(self)
        return report
