"""The one memory bound of a sender, `max_queue_bytes`, and the one formula every part asks about it."""

from __future__ import annotations

from summaryd.client._sender._batch_log import BatchLog
from summaryd.client._sender._items import FAST_ITEM_BYTES
from summaryd.client._sender._queue import EventQueue


class MemoryBudget:
    """What a sender holds in memory, against `max_queue_bytes`: the queued events (estimated bytes), the
    batches in memory (unacknowledged, or acknowledged and kept until durable) and the room a caller waits for.
    The caller's side (to apply the overflow policy), the spiller (when memory is why it spills) and the sender
    thread (how far callers may append without the lock) all ask here. Every call holds the sender's lock."""

    def __init__(self, limit: int, queue: EventQueue, batches: BatchLog) -> None:
        self.limit = limit
        self._queue = queue
        self._batches = batches
        # Callers append without the lock until they used half of the room they were given (in small events).
        self._refill_below = limit // FAST_ITEM_BYTES // 2

    def room(self) -> int:
        """Bytes left under the bound (negative: over it), counted exactly."""
        return self.limit - self._batches.memory_bytes - self._queue.nbytes

    def over(self, nbytes: int = 0, *, queue_only: bool = False) -> bool:
        """Whether memory with `nbytes` more (or the room a caller waits for, the larger) is over the bound.

        `queue_only`: count the queue alone, while the sender thread moves the batches to the spool (a caller
        waiting for room under policy `spill` waits only for the events not serialized yet). Decided from the
        queue's upper bound when it can be, so that asking often does not count every event appended since.
        """
        held = 0 if queue_only else self._batches.memory_bytes
        return not self._queue.under(self.limit - held - max(nbytes, self._queue.room_wanted) + 1)

    def open_fast(self, accepting: bool) -> None:
        """Let callers append small events without the lock, as many as the room left takes."""
        self._queue.open_fast(self.limit - self._batches.memory_bytes, accepting)

    def refill(self, accepting: bool) -> None:
        """Once callers used up half their lock-free room, measure it again (acknowledgements freed some), so
        that they rarely take the lock for it."""
        if self._queue.fast_room() < self._refill_below:
            self.open_fast(accepting)
