"""What the sender's parts see of the caller's queue.

The queue itself (`_sender.EventQueue`) lives beside its hot path, `Sender.enqueue`, which appends to it inline;
the parts that drain and count it see it through this protocol, so that none of them imports the facade.
"""

from __future__ import annotations

from typing import Protocol

from summaryd.client._sender._items import Queued


class QueuedEvents(Protocol):
    """The events the caller queued and the sender has not yet taken into batches. Every call holds the
    sender's lock (callers append without it: only the sender's side takes events off)."""

    @property
    def accepted(self) -> int:
        """Events ever queued: what the sender owes the caller an account of."""

    @property
    def nbytes(self) -> int:
        """Estimated bytes of the queued events."""

    def under(self, nbytes: int) -> bool:
        """Whether the queued events take fewer than `nbytes` (estimated)."""

    @property
    def queued_at(self) -> float:
        """When the oldest event of the next batch arrived (what linger counts from)."""

    @property
    def lingering(self) -> bool:
        """Whether the next batch may wait for more events (`linger_secs`): not while events a `flush()` asked
        to send now are still queued."""

    def __len__(self) -> int: ...

    def take_run(self, max_events: int, max_bytes: int, scalars_apart: bool = False) -> list[Queued]:
        """Pop the next events of a batch (see `EventQueue.take_run`)."""

    def take_scalars(self, max_events: int, max_bytes: int) -> tuple[list[Queued], int]:
        """Pop the next run of plain scalars, for a batch of columns, and their estimated bytes."""

    def open_fast(self, held_bytes: int, max_queue_bytes: int, accepting: bool) -> None:
        """Let callers append small events without the lock while they fit (see `EventQueue`)."""

    def fast_room(self) -> int:
        """How many more small events callers may append without the lock."""

    def clear(self) -> int:
        """Forget every queued event; how many there were."""

    def over_budget(self, held_bytes: int, max_queue_bytes: int, nbytes: int = 0) -> bool:
        """Whether the queue and `held_bytes` in memory, with `nbytes` more, are over the memory bound."""
