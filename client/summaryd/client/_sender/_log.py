"""Numbering events into batches, and settling them: acknowledgements, refusals, giving up."""

from __future__ import annotations

import time

from summaryd.client._sender._items import Batch, Queued, size_known
from summaryd.client._sender._state import SenderState, log


class BatchLog(SenderState):
    """The sender's log: every numbered batch until the daemon acknowledges it (or it is given up)."""

    def _take_batch(self) -> Batch | None:
        """Number the next queued events as one batch (the send cuts it to the daemon's limits, `_batch_fit`);
        an event no message may carry is dropped first."""
        events: list[bytes] = []
        nbytes = 0
        while len(events) < self.max_batch_events and nbytes < self.max_batch_bytes:
            with self._lock:
                items = self._take_run(self.max_batch_events - len(events), self.max_batch_bytes - nbytes)
            if not items:
                break
            for item in items:
                data = self._encode(item)
                if data is not None:
                    events.append(data)
                    nbytes += len(data)
        events, too_large = self._daemon_limits.sort_out(events, nbytes, self.session_id)
        if too_large:
            self._drop_too_large(too_large)
            nbytes -= sum(map(len, too_large))
        if not events:
            return None
        with self._cond:
            batch = Batch(self._next_sequence, len(events), nbytes, events)
            self._next_sequence += len(events)
            self._log.append(batch)
            self._held_bytes += nbytes
            self._held_events += len(events)
            self._cond.notify_all()
        return batch

    def _drop_too_large(self, events: list[bytes]) -> None:
        """Events over the daemon's limits: no resend could deliver them (counted as rejected, and logged)."""
        limits = self._daemon_limits
        with self._cond:
            self._dropped["rejected"] += len(events)
            self._settled += len(events)
            self._cond.notify_all()
        log.error(
            "summaryd: dropped %d event(s) of run %r of up to %d bytes: the daemon at %s takes events of at most "
            "%d bytes (--max-event-bytes) in messages of at most %d bytes (--max-message-bytes)",
            len(events),
            self.run,
            max(map(len, events)),
            self.address,
            limits.max_event_bytes,
            limits.max_message_bytes,
        )

    def _take_run(self, max_events: int, max_bytes: int) -> list[Queued]:
        """Pop the next events of a batch (holding the lock): a run of those whose size is known, so that the
        lock the caller also takes is taken once per run, not per event; a function alone, since only encoding
        it tells its size."""
        queue = self._queue
        if not queue:
            return []
        first = queue.popleft()
        items = [first]
        room = max_bytes - first[-1]
        if size_known(first):
            while queue and len(items) < max_events and room > 0:
                head = queue[0]
                if not size_known(head):
                    break
                items.append(queue.popleft())
                room -= head[-1]
        self._queued_bytes -= max_bytes - room
        self._queued_at = time.monotonic()
        return items

    def _encode(self, item: Queued) -> bytes | None:
        """The bytes of a queued event; None (counted) when building it failed."""
        try:
            if len(item) == 5:
                return self._encoder.scalar(item)  # protobuf only: no lock a fork could inherit held
            if len(item) == 4:
                return self._encoder.summary(item)
            source = item[0]
            if isinstance(source, bytes):
                return source
            assert callable(source)
            with self._encoding:
                data: bytes = source()
                return data
        except Exception as exc:
            log.warning("summaryd: could not encode an event for run %r: %s", self.run, exc)
            with self._cond:
                self._dropped["encode_error"] += 1
                self._settled += 1
                self._cond.notify_all()
            return None

    def _on_ack(self, acked: int) -> None:
        """Runs on the ack thread: settle every batch up to `acked`."""
        with self._cond:
            if acked <= self._acked:
                return
            self._acked = acked
            self._progress_at = time.monotonic()
            self._backoff = self.backoff_secs[0]
            while self._log and self._log[0].last <= acked:
                batch = self._log.popleft()
                batch.settled = True
                self._in_flight = max(0, self._in_flight - 1)
                self._count_delivered(batch, batch.count - batch.done)
                if batch.events is not None:
                    self._held_bytes -= batch.nbytes
            if self._log and self._log[0].first <= acked:
                head = self._log[0]
                newly = acked - head.first + 1 - head.done
                head.done += newly
                self._count_delivered(head, newly)
            self._cond.notify_all()
        self._wake.set()

    def _count_delivered(self, batch: Batch, events: int) -> None:
        self._delivered += events
        self._settled += events
        if batch.events is None:
            self._spooled -= events
        else:
            self._held_events -= events

    def _handle_refusal(self) -> None:
        """The daemon refused the oldest unacknowledged batch and wrote none of it. When it named the event it
        refused, drop that event alone (the data itself is bad, a resend cannot help); otherwise the batch. Then
        number the rest on from the last acknowledged event and send it again."""
        with self._cond:
            reason, self._refused = self._refused, None
            sequence, self._refused_sequence = self._refused_sequence, None
            if reason is None:
                return
            if self._spooled:
                self._unspill()
            if self._log:
                head = self._log[0]
                if sequence is not None and head.events is not None and head.first + head.done <= sequence <= head.last:
                    self._drop_one(head, sequence - head.first)
                    log.error("summaryd: the daemon refused an event of run %r: %s", self.run, reason)
                else:
                    self._log.popleft()
                    head.settled = True
                    self._held_bytes -= head.nbytes
                    self._held_events -= head.count - head.done
                    self._dropped["rejected"] += head.count - head.done
                    self._settled += head.count - head.done
                    log.error("summaryd: the daemon refused %d events of run %r: %s", head.count, self.run, reason)
            sequence = self._acked + 1
            for batch in self._log:
                batch.first, batch.done = sequence, 0
                sequence += batch.count
            self._next_sequence = sequence
            self._cond.notify_all()

    def _drop_one(self, head: Batch, index: int) -> None:
        """Take event `index` out of the in-memory batch `head`, with the events acknowledged already (they are
        counted); the batch keeps the rest, to be renumbered. Holds the lock."""
        assert head.events is not None
        kept = head.events[head.done : index] + head.events[index + 1 :]
        nbytes = sum(map(len, kept))
        self._held_bytes -= head.nbytes - nbytes
        self._held_events -= 1
        self._dropped["rejected"] += 1
        self._settled += 1
        head.events, head.count, head.nbytes, head.done = kept, len(kept), nbytes, 0
        if not kept:
            self._log.popleft()
            head.settled = True

    def _unspill(self) -> None:
        """Holding the lock: read every spilled batch back into memory and delete the spool (renumbering)."""
        assert self._spool is not None
        for batch in self._log:
            if batch.events is None and batch.span is not None:
                events = self._spool.read(batch.span)[batch.done :]
                batch.first, batch.count, batch.done = batch.first + batch.done, len(events), 0
                batch.events, batch.span, batch.nbytes = events, None, sum(map(len, events))
                self._spooled -= len(events)
                self._held_events += len(events)
                self._held_bytes += batch.nbytes
        self._spool.discard()
        self._spool = None

    def _give_up(self, reason: str) -> None:
        """A permanent refusal (bad run path, no permission): drop everything, report it on close."""
        log.error("summaryd: giving up on run %r: %s", self.run, reason)
        with self._cond:
            self._failed = reason
            dropped = len(self._queue) + sum(b.count - b.done for b in self._log)
            self._dropped["rejected"] += dropped
            self._settled += dropped
            self._queue.clear()
            self._queued_bytes = 0
            for batch in self._log:
                batch.settled = True
            self._log.clear()
            self._held_bytes = self._held_events = self._spooled = self._in_flight = 0
            self._cond.notify_all()
        if self._spool is not None:
            self._spool.discard()
            self._spool = None
