"""The sender thread: numbering queued events into batches, and its loop over the other parts."""

from __future__ import annotations

import threading
import time

from summaryd.client._process import _exit
from summaryd.client._sender._columns import ScalarRun
from summaryd.client._sender._connection import Connection
from summaryd.client._sender._core import SenderCore, SenderPart
from summaryd.client._sender._encoder import EventEncoder
from summaryd.client._sender._items import Batch, Queued
from summaryd.client._sender._kinds import SCALAR, SUMMARY
from summaryd.client._sender._spiller import Spiller
from summaryd.client._sender._status import log

BACKED_UP_BATCHES = 8
"""A backed-up queue's scalars go in batches of up to this many times `max_batch_events`."""

FLUSH_GAP_SECS = 0.01
"""Events a `flush()` asked to send leave at once, but at most one such batch per this many seconds (never more
than `linger_secs`): a framework that flushes after every step of a fast loop costs one message per gap, not one
per step (each message a wake-up of this thread, and the GIL taken from the loop)."""

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
"""The steps an event carries."""


def _sendable(scalar: Queued) -> bool:
    """Whether an event carries this queued scalar: its step within int64, its tag UTF-8."""
    try:
        scalar[1].encode()  # type: ignore[union-attr]
    except UnicodeEncodeError:
        return False
    return bool(_INT64_MIN <= scalar[3] <= _INT64_MAX)  # type: ignore[misc]


AFTER_POLL_SECS = 0.05
"""How often a sender waiting for its predecessor's session to end looks again."""


class SenderLoop(SenderPart):
    """One named daemon thread per sender, started on the first event; it does all the work but queueing:
    numbers events into the batch log, has the connection send them, the spiller spill them, and ends once
    everything is acknowledged after a close (or when told to stop)."""

    def __init__(self, core: SenderCore, spiller: Spiller, connection: Connection) -> None:
        super().__init__(core)
        self._encoding = core.encoding  # held while an event is encoded; a fork waits for it (see `_process._fork`)
        self._spiller = spiller
        self._connection = connection
        self._encoder = EventEncoder()
        self._flush_gap = min(FLUSH_GAP_SECS, core.options.linger_secs)
        self._flushed_at = -float("inf")  # when the last batch a flush() asked for was numbered
        self._thread: threading.Thread | None = None
        self.after: SenderLoop | None = None  # a closing sender of the same run, to finish before this one opens
        self.started = False
        """Whether the thread was started: a plain attribute, since the caller's hot path reads it."""

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float) -> bool:
        """Wait for the thread to end; whether it did."""
        if self._thread is not None and self._thread.ident is not None:  # None: it never started
            self._thread.join(timeout)
        return not self.alive()

    def start(self) -> None:
        _exit.register_multiprocessing_exit()
        with self._cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name=f"summaryd-sender[{self._identity.run}]", daemon=True
            )
            # Started holding the lock (its loop waits for it): a close() on another thread that sees `started`
            # then finds the thread running, never one about to start.
            try:
                self._thread.start()
            except RuntimeError:  # the interpreter is shutting down
                self._fail("the sender thread could not start (interpreter exiting)")
            self.started = True

    def _run(self) -> None:
        try:
            # A close that finds kept events missing resumes the session and goes on (`Connection.finish`).
            while self._loop() and not self._connection.finish():
                pass
        except Exception as exc:  # a bug here must not go unnoticed, nor reach the training loop
            log.exception("summaryd sender for run %r failed", self._identity.run)
            with self._cond:
                self._fail(f"sender failed: {exc!r}")
        finally:
            self._connection.shut()
            self._spiller.put_away()
            with self._cond:
                self._cond.notify_all()

    def _loop(self) -> bool:
        """Run until everything is acknowledged after a close (True), or until told to stop (False)."""
        connection = self._connection
        while True:
            with self._cond:
                self._queue.disarm()  # awake: this pass looks at the queue, no caller needs to wake it
                if self._status.failed is not None:
                    return False
                if self._status.closing and not self._queue and not self._batches and not connection.resume_owed:
                    return True
                in_outbox = not self._queue and not self._batches.held_events
                if self._outbox_pid is not None and self._status.closing and in_outbox:
                    return False  # all in the outbox: the parent's courier delivers it
            # Told to stop, or closing past the deadline with no one waiting (a writer dropped, or closed by a
            # framework, without a wait): what is left goes to the spool, and the thread ends.
            if self._abandon.is_set() or (self._status.closing and time.monotonic() >= self._status.close_deadline):
                self._spiller.spill(everything=True, number=self.number)
                return False
            self._handle_refusal()
            self._spiller.discard_when_acknowledged()
            if self.after is not None and not self.after.alive():
                self.after = None
            # A session opens after its predecessor's is done, so that the daemon's new file sorts after the one
            # it finished (TensorBoard reads a run's files in name order and never goes back).
            if self._outbox_pid is None and self.after is None:
                refused = self._connection.poll()
                if refused is not None:
                    self._give_up(refused)
                    continue
            self._take_batches()
            # Closing while the daemon is away: make everything safe on disk now, then keep trying to deliver
            # until close() runs out of time.
            everything = self._status.spill_all or self._connection.unreachable_while_closing()
            self._spiller.spill(everything=everything, number=self.number)
            self._connection.send_ready()
            self._connection.keep_alive()
            with self._cond:
                # Callers wake this thread at the first event or a full batch from now on (`EventQueue.arm`),
                # unless one arrived just now: then it looks again at once.
                waits = self._queue.arm(self._options.max_batch_events)
            if waits:
                self._wake.wait(self._next_wakeup())
            self._wake.clear()

    def _take_batches(self) -> None:
        """Number queued events into batches, as many as may be in flight. Not when spilling: the spiller then
        spills the batches in memory first and numbers the queue after them (`Spiller.spill`), so that the
        spilled batches stay a prefix of the log."""
        options, pacing = self._options, self._connection.pacing
        while True:
            with self._cond:
                if not self._queue or self._spiller.must_spill():
                    return
                if not self._connection.streaming:
                    # Full batches are numbered even so: their columns hold what the queue's tuples held, and the
                    # tuples freed give the caller's next ones memory it has touched already (fresh memory costs
                    # the caller's thread a page fault every few dozen events while the daemon is away).
                    if len(self._queue) < options.max_batch_events:
                        return
                elif self._batches.in_flight >= pacing.max_in_flight:
                    return
                now = time.monotonic()
                flushed = not self._queue.lingering
                small = len(self._queue) < options.max_batch_events and self._queue.under(options.max_batch_bytes)
                if now < self._due() and small and not self._status.closing:
                    return
            if self.number() is None:
                return
            if flushed:
                self._flushed_at = now

    def _due(self) -> float:
        """Holding the lock, with events queued: when the next batch leaves though not full. A flush's events
        leave at once, unless one flush's batch left less than the gap ago."""
        if self._queue.lingering:
            return self._queue.queued_at + self._connection.pacing.linger_secs
        return self._flushed_at + self._flush_gap

    def number(self) -> Batch | None:
        """Number the next queued events as one batch (the send cuts it to the daemon's limits, `_batch_fit`);
        an event no message may carry is dropped first."""
        options = self._options
        # Before any daemon answered, scalars are numbered as columns too: the send encodes them for a daemon that
        # does not take columns.
        columns = self._connection.limits.takes_scalar_columns or not self._connection.answered
        if columns:
            batch = self._number_scalars()
            if batch is not None:
                return batch
        events: list[bytes] = []
        nbytes = 0
        while len(events) < options.max_batch_events and nbytes < options.max_batch_bytes:
            with self._cond:
                room = options.max_batch_bytes - nbytes
                items = self._queue.take_run(options.max_batch_events - len(events), room, scalars_apart=columns)
            if not items:
                break
            for item in items:
                data = self._encode(item)
                if data is not None:
                    events.append(data)
                    nbytes += len(data)
        limits = self._connection.limits
        events, too_large = limits.sort_out(events, nbytes, self._identity.session_id)
        if too_large:
            self._drop_too_large(too_large)
            nbytes -= sum(map(len, too_large))
        if not events:
            return None
        with self._cond:
            batch = self._batches.append(events, nbytes)
            self._refill()
            self._cond.notify_all()
        return batch

    def _number_scalars(self) -> Batch | None:
        """Number the run of scalars at the head of the queue as one batch of columns: no event is built here,
        the daemon builds them (a batch holds one kind, so events keep their order across kinds)."""
        options = self._options
        most = options.max_batch_events
        with self._cond:
            queued = len(self._queue)
            if queued > most:
                # Backed up (the caller outran this thread): fewer, larger batches, up to what the daemon takes in
                # one (its CPU per scalar falls by 10-25 % from 1,000- to 8,000-scalar batches), within
                # `max_batch_bytes` as always.
                most = min(queued, most * BACKED_UP_BATCHES, self._connection.limits.max_batch_events or most)
            items, nbytes, one_tag = self._queue.take_scalars(most, options.max_batch_bytes)
        if not items:
            return None
        try:
            scalars = ScalarRun.of(items, one_tag)
        except ValueError:
            items, nbytes = self._drop_unsendable(items, nbytes)
            if not items:
                return None
            scalars = ScalarRun.of(items)
        if not self._connection.streaming:  # it waits for the daemon: its objects are freed for the caller's reuse
            scalars = scalars.packed()
        with self._cond:
            batch = self._batches.append([], nbytes, scalars)
            self._refill()
            self._cond.notify_all()
        return batch

    def _drop_unsendable(self, items: list[Queued], nbytes: int) -> tuple[list[Queued], int]:
        """The scalars of `items` that an event carries, and their bytes. The others (a step beyond int64, a tag
        that is not UTF-8) are dropped before they are numbered, counted and logged as events that could not be
        built: bad input costs that scalar alone, never the batch or the sender."""
        kept = [item for item in items if _sendable(item)]
        dropped = len(items) - len(kept)
        with self._cond:
            self._ledger.settle(dropped, "encode_error")
            self._cond.notify_all()
        log.warning(
            "summaryd: dropped %d scalar(s) of run %r that no event carries (a step beyond int64 or a tag that is "
            "not UTF-8)",
            dropped,
            self._identity.run,
        )
        return kept, nbytes - sum(item[-1] for item in items) + sum(item[-1] for item in kept)

    def _refill(self) -> None:
        """Holding the lock: give callers lock-free room again when they used up half of it."""
        self._budget.refill(self._status.accepting)

    def _drop_too_large(self, events: list[bytes]) -> None:
        """Events over the daemon's limits: no resend could deliver them (counted as rejected, and logged)."""
        limits = self._connection.limits
        with self._cond:
            self._ledger.settle(len(events), "rejected")
            self._cond.notify_all()
        log.error(
            "summaryd: dropped %d event(s) of run %r of up to %d bytes: the daemon at %s takes events of at most "
            "%d bytes (--max-event-bytes) in messages of at most %d bytes (--max-message-bytes)",
            len(events),
            self._identity.run,
            max(map(len, events)),
            self._options.address,
            limits.max_event_bytes,
            limits.max_message_bytes,
        )

    def _encode(self, item: Queued) -> bytes | None:
        """The bytes of a queued event; None (counted) when building it failed."""
        try:
            kind = item[0]
            if kind == SCALAR:
                return self._encoder.scalar(item)  # protobuf only: no lock a fork could inherit held
            if kind == SUMMARY:
                return self._encoder.summary(item)
            source = item[1]
            if isinstance(source, bytes):
                return source
            assert callable(source)
            with self._encoding:
                data: bytes = source()
                return data
        except Exception as exc:
            log.warning("summaryd: could not encode an event for run %r: %s", self._identity.run, exc)
            with self._cond:
                self._ledger.settle(1, "encode_error")
                self._cond.notify_all()
            return None

    def _handle_refusal(self) -> None:
        """The daemon refused the oldest unacknowledged batch: drop what it refused, send the rest again."""
        with self._cond:
            refusal = self._batches.take_refusal()
            if refusal is None:
                return
            reason, sequence = refusal
            self._spiller.load_all()
            dropped, named = self._batches.refuse(sequence)
            self._cond.notify_all()
        if named:
            log.error("summaryd: the daemon refused an event of run %r: %s", self._identity.run, reason)
        elif dropped:
            log.error("summaryd: the daemon refused %d events of run %r: %s", dropped, self._identity.run, reason)

    def _fail(self, reason: str) -> None:
        """Holding the lock: fail for good; callers' events are refused from now on."""
        self._status.fail(reason)
        self._queue.stop_taking()

    def _give_up(self, reason: str) -> None:
        """A permanent refusal (bad run path, no permission): drop everything, report it on close."""
        log.error("summaryd: giving up on run %r: %s", self._identity.run, reason)
        with self._cond:
            self._fail(reason)
            self._ledger.settle(self._queue.clear(), "rejected")
            self._batches.drop_all("rejected")
            self._cond.notify_all()
        self._spiller.discard()

    def _next_wakeup(self) -> float:
        """Seconds to sleep unless woken. Only what this thread can do when the time comes counts: a batch's time
        to leave while the stream can take it (not while the daemon is away: the reconnect schedule wakes it
        then), the spool while it is not yet due; a moment passed that nothing acts on would have it wake
        every millisecond. Each wake-up takes the GIL from the training loop, which on a loaded machine waits
        for this thread to be scheduled first."""
        now = time.monotonic()
        waits = [1.0, self._status.close_deadline - now]
        connection = self._connection
        if self._outbox_pid is None:  # a forked child's outbox needs no daemon
            waits.append(connection.wait_hint(now) if self.after is None else AFTER_POLL_SECS)
        with self._cond:
            if self._queue and connection.streaming and self._batches.in_flight < connection.pacing.max_in_flight:
                waits.append(self._due() - now)
            if self._queue or self._batches:
                spill_in = self._options.spool_after - (now - self._batches.progress_at)
                if spill_in > 0:
                    waits.append(spill_in)
                elif self._queue and self._spiller.must_spill():
                    waits.append(self._spiller.queue_spill_in(now))  # the queue's next spool write
                if connection.streaming:
                    waits.append(0.1)  # acks, overdue batches and the in-flight window
        return max(0.001, min(waits))
