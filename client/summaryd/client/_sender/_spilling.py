"""Moving unacknowledged batches to the spool on local disk, and putting the spool away."""

from __future__ import annotations

import time

from summaryd.client._courier import outbox_root
from summaryd.client._sender._items import Batch
from summaryd.client._sender._log import BatchLog
from summaryd.client._sender._state import log
from summaryd.client._spool import Spool, SpoolIdentity


class Spilling(BatchLog):
    """Spills the log (and the queue) to the spool when the daemon is away, memory is over its bound, or
    `close()` runs out of time; deletes the spool once the daemon acknowledged all of it."""

    def _must_spill(self) -> bool:
        """Holding the lock: whether unacknowledged events should go to disk now."""
        if not self._can_spool():
            return False
        if self._spill_all or self._abandon.is_set() or self._outbox_pid is not None:
            return True
        if (self._queue or self._log) and time.monotonic() - self._progress_at >= self.spool_after:
            return True
        return self.overflow == "spill" and self._over_budget()

    def _spill(self, *, everything: bool) -> None:
        """Move every in-memory batch of the log to the spool, then number and spill the queue too, when
        spilling is due (or `everything` is asked for, at close)."""
        with self._lock:
            due = everything or self._must_spill()
            if not due or not self._can_spool():
                return
            # Spilled batches are a prefix of the log, the ones in memory the rest: take them from the end.
            pending: list[Batch] = []
            for batch in reversed(self._log):
                if batch.events is None:
                    break
                pending.append(batch)
        for batch in reversed(pending):
            if not self._spill_batch(batch):
                return
        while True:
            with self._lock:
                if not self._queue or not (everything or self._must_spill()):
                    return
            taken = self._take_batch()
            if taken is None or not self._spill_batch(taken):
                return

    def _spill_batch(self, batch: Batch) -> bool:
        """Write one in-memory batch to the spool and free its memory; False when the spool failed."""
        with self._lock:
            if batch.events is None or batch.settled:
                return True  # spilled already, or acknowledged meanwhile
            events = batch.events
        try:
            if self._spool is None:
                self._spool = self._open_spool(batch.first)
            span = self._spool.append(events)
        except OSError as exc:
            self._spool_failed(exc)
            return False
        with self._cond:
            if not batch.settled and batch.events is not None:
                batch.events, batch.span = None, span
                self._held_bytes -= batch.nbytes
                self._held_events -= batch.count - batch.done
                self._spooled += batch.count - batch.done
            self._cond.notify_all()
        return True

    def _open_spool(self, first_sequence: int) -> Spool:
        identity = SpoolIdentity(
            self.session_id,
            self.run,
            self.worker,
            self.world_size,
            self.address,
            self.framework,
            session_started=self.session_started,
        )
        if self._outbox_pid is not None:
            return Spool(outbox_root(self.spool_root, self._outbox_pid), identity, first_sequence)
        spool = Spool(self.spool_root, identity, first_sequence)
        if not self._told_spool:
            self._told_spool = True
            if self._closing:
                why = "closing before the daemon acknowledged them"
            elif self._queued_bytes + self._held_bytes > self.max_queue_bytes:
                why = f"more than max_queue_bytes={self.max_queue_bytes} waiting"
            else:
                why = f"no acknowledgement from {self.address} for {self.spool_after:g}s"
            log.warning(
                "summaryd: spooling events of run %r to %s (%s); they are sent when the daemon answers, and any "
                "left when this process ends are delivered by: summaryd replay %s",
                self.run,
                spool.directory,
                why,
                spool.directory,
            )
        return spool

    def _spool_failed(self, exc: OSError) -> None:
        with self._cond:
            self._spool_error = f"{exc.strerror or exc}"
            self._cond.notify_all()
        log.error(
            "summaryd: cannot spool events of run %r to %s (%s); keeping them in memory up to max_queue_bytes",
            self.run,
            self.spool_root,
            self._spool_error,
        )

    def _put_spool_away(self) -> None:
        """When the thread ends: delete a spool that is fully acknowledged, keep (sync) one that is not."""
        spool = self._spool
        if spool is None:
            return
        with self._lock:
            still_spooled = self._spooled > 0
        if still_spooled:
            spool.keep()
        else:
            spool.discard()
            with self._lock:
                self._spool = None

    def _discard_spool_when_acknowledged(self) -> None:
        if self._spool is None:
            return
        with self._lock:
            still_spooled = self._spooled > 0
        if not still_spooled:
            self._spool.discard()
            if self._told_spool:
                log.warning(
                    "summaryd: the daemon acknowledged every spooled event of run %r; removed the spool %s "
                    "(nothing to replay)",
                    self.run,
                    self._spool.directory,
                )
                self._told_spool = False
            self._spool = None
