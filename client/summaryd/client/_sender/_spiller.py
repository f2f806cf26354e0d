"""Moving unacknowledged batches to the spool on local disk and back, and putting the spool away."""

from __future__ import annotations

import time
from collections.abc import Callable

from summaryd.client._sender._core import SenderCore, SenderPart
from summaryd.client._sender._items import Batch
from summaryd.client._sender._status import log
from summaryd.client._spool import Spool, outbox_root

SPILL_GAP_SECS = 1.0
"""While the daemon is away (past `spool_after`), the queue goes to the spool once it holds a full batch or its
oldest event waited this long (never longer than `spool_after`): one write per gap, not one per `flush()`. A
framework flushing after every step would otherwise have the sender thread wake and write one event each time
(800 writes and wake-ups a second for a loop of 1,000 steps a second)."""


class Spiller(SenderPart):
    """Spills the batch log (and the queue) to the session's spool when the daemon is away, memory is over its
    bound, or `close()` runs out of time; reads spilled batches to send them; deletes the spool once the daemon
    acknowledged all of it. In a forked child (`outbox_pid`) every batch goes to the outbox the parent's
    courier delivers. Sender thread only, but for the questions asked holding the lock."""

    def __init__(self, core: SenderCore) -> None:
        super().__init__(core)
        self._spool: Spool | None = None
        self.error: str | None = None  # why the spool failed; then nothing more is spilled
        self._told = False

    @property
    def path(self) -> str | None:
        """The spool's directory while there is one."""
        return str(self._spool.directory) if self._spool is not None else None

    def can_spool(self) -> bool:
        return (self._options.spool_enabled or self._outbox_pid is not None) and self.error is None

    def must_spill(self) -> bool:
        """Holding the lock: whether unacknowledged events should go to disk now."""
        if not self.can_spool():
            return False
        if self._status.spill_all or self._abandon.is_set() or self._outbox_pid is not None:
            return True
        waiting = bool(self._queue) or bool(self._batches)
        if waiting and time.monotonic() - self._batches.progress_at >= self._options.spool_after:
            return True
        return self._options.overflow == "spill" and self._budget.over()

    def spill(self, *, everything: bool, number: Callable[[], Batch | None]) -> None:
        """Move every in-memory batch of the log to the spool, then number (`number`) and spill the queue too,
        when spilling is due (or `everything` is asked for, at close); the queue in whole batches, or once it
        lingered `SPILL_GAP_SECS` (`queue_spill_in`)."""
        with self._lock:
            if not (everything or self.must_spill()) or not self.can_spool():
                return
            pending = self._batches.in_memory_tail()
        for batch in pending:
            if not self.spill_batch(batch):
                return
        while True:
            with self._lock:
                if not self._queue or not (everything or self.must_spill()):
                    return
                if not everything and self.queue_spill_in(time.monotonic()) > 0:
                    return
            taken = number()
            if taken is None or not self.spill_batch(taken):
                return

    def queue_spill_in(self, now: float) -> float:
        """Holding the lock, spilling due: seconds until the queue goes to the spool (0: now). At once when it
        holds a full batch, memory is over its bound, or everything must go (closing, told to stop, a forked
        child's outbox); else once its oldest event waited the gap."""
        options, queue = self._options, self._queue
        if self._status.spill_all or self._abandon.is_set() or self._outbox_pid is not None:
            return 0.0
        if options.overflow == "spill" and self._budget.over():
            return 0.0
        if len(queue) >= options.max_batch_events or not queue.under(options.max_batch_bytes):
            return 0.0
        return max(0.0, queue.queued_at + min(SPILL_GAP_SECS, options.spool_after) - now)

    def spill_batch(self, batch: Batch) -> bool:
        """Write one in-memory batch to the spool and free its memory; False when the spool failed."""
        with self._lock:
            if batch.events is None or batch.settled:
                return True  # spilled already, or acknowledged meanwhile
            events = batch.encoded()
            assert events is not None
        try:
            if self._spool is None:
                self._spool = self._open(batch.first)
            span = self._spool.append(events)
        except OSError as exc:
            self._failed(exc)
            return False
        with self._lock:
            self._batches.spilled(batch, span)
        return True

    def read(self, span: tuple[int, int]) -> list[bytes]:
        """The events of a spilled batch (its `span`), to send them."""
        assert self._spool is not None
        return self._spool.read(span)

    def load_all(self) -> None:
        """Holding the lock: read every spilled batch back into memory and delete the spool (a refusal renumbers
        what follows, which the spool's file cannot)."""
        if self._spool is None:
            return
        for batch in self._batches:
            if batch.events is None and batch.span is not None:
                self._batches.loaded(batch, self._spool.read(batch.span)[batch.done :])
        self._spool.discard()
        self._spool = None

    def _open(self, first_sequence: int) -> Spool:
        options = self._options
        if self._outbox_pid is not None:
            return Spool(outbox_root(options.spool_root, self._outbox_pid), self._identity, first_sequence)
        spool = Spool(options.spool_root, self._identity, first_sequence)
        if not self._told:
            self._told = True
            if self._status.closing:
                why = "closing before the daemon acknowledged them"
            elif self._budget.over():
                why = f"more than max_queue_bytes={options.max_queue_bytes} waiting"
            else:
                why = f"no acknowledgement from {options.address} for {options.spool_after:g}s"
            log.warning(
                "summaryd: spooling events of run %r to %s (%s); they are sent when the daemon answers, and any "
                "left when this process ends are delivered by: summaryd replay %s",
                self._identity.run,
                spool.directory,
                why,
                spool.directory,
            )
        return spool

    def _failed(self, exc: OSError) -> None:
        with self._lock:
            self.error = f"{exc.strerror or exc}"
        log.error(
            "summaryd: cannot spool events of run %r to %s (%s); keeping them in memory up to max_queue_bytes",
            self._identity.run,
            self._options.spool_root,
            self.error,
        )

    def put_away(self) -> None:
        """When the sender thread ends: delete a spool that is fully acknowledged, keep (sync) one that is not."""
        spool = self._spool
        if spool is not None and self._still_spooled():
            spool.keep()
        else:
            self.discard_when_acknowledged()

    def _still_spooled(self) -> bool:
        with self._lock:
            return self._ledger.spooled > 0

    def discard_when_acknowledged(self) -> None:
        spool = self._spool
        if spool is None or self._still_spooled():
            return
        spool.discard()
        if self._told:
            log.warning(
                "summaryd: the daemon acknowledged every spooled event of run %r; removed the spool %s "
                "(nothing to replay)",
                self._identity.run,
                spool.directory,
            )
            self._told = False
        self._spool = None

    def discard(self) -> None:
        """Giving up: the spool's events were dropped."""
        if self._spool is not None:
            self._spool.discard()
            self._spool = None

    def leave_to_parent(self) -> None:
        """In a forked child: the parent's spool is the parent's (no unlock, no delete)."""
        if self._spool is not None:
            self._spool.forget()
