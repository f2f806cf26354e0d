"""The caller's side of the sender: events handed over and not yet numbered into batches."""

from __future__ import annotations

import time
from collections import deque

from summaryd.client._sender._items import Queued, size_known


class EventQueue:
    """A deque of queued events and their estimated bytes. Every call holds the sender's lock."""

    def __init__(self) -> None:
        self.items: deque[Queued] = deque()
        self.nbytes = 0
        self.queued_at = 0.0  # when the oldest event of the next batch arrived (what linger counts from)
        self.room_wanted = 0  # bytes a caller waits to queue (policies spill and block)
        self.accepted = 0  # events ever queued: what the sender owes the caller an account of

    def __len__(self) -> int:
        return len(self.items)

    def append(self, item: Queued, now: float | None) -> int:
        """Accept `item`; `now` when it starts a new batch (the linger clock). The queued bytes before it."""
        if now is not None:
            self.queued_at = now
        self.items.append(item)
        self.accepted += 1
        before = self.nbytes
        self.nbytes = before + item[-1]
        return before

    def take_run(self, max_events: int, max_bytes: int) -> list[Queued]:
        """Pop the next events of a batch: a run of those whose size is known, so that the lock the caller also
        takes is taken once per run, not per event; a function alone, since only encoding it tells its size."""
        queue = self.items
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
        self.nbytes -= max_bytes - room
        self.queued_at = time.monotonic()
        return items

    def drop_oldest(self) -> None:
        self.nbytes -= self.items.popleft()[-1]

    def clear(self) -> int:
        """Forget every queued event; how many there were."""
        count = len(self.items)
        self.items.clear()
        self.nbytes = 0
        return count

    def want_room(self, nbytes: int) -> None:
        """A caller waits to queue `nbytes` (0: no longer): the budget counts them already."""
        self.room_wanted = nbytes


def over_budget(queue: EventQueue, held_bytes: int, max_queue_bytes: int, nbytes: int = 0) -> bool:
    """Whether the queue and the batches in memory (`held_bytes`), with `nbytes` more (or the room a caller
    waits for), are over the memory bound."""
    return queue.nbytes + held_bytes + max(nbytes, queue.room_wanted) > max_queue_bytes
