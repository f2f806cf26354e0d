"""What the caller's queue and the sender's batch log hold."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from summaryd.client._sender._columns import ScalarRun
from summaryd.client._sender._kinds import SOURCE

# An event to send: its serialized bytes, a scalar, or a function that builds them on the sender thread (so
# that no encoding, PNG or protobuf, runs on the caller's thread).
EventSource = bytes | Callable[[], bytes]

# What the queue holds, each kind one flat tuple of atomic values, its kind first (a small int) and its
# estimated bytes last: a plain tuple, because the garbage collector stops tracking one of atomic values the
# first time it sees it, however long the queue grows (an object per event, a tuple subclass too, stays tracked
# and cost full collections of the training process's heap); the kind an int in it, because the caller builds
# one of these per logged event and a constant costs it one more slot, where a class would cost a call. The
# kinds are named in `_kinds`.
QueuedSource = tuple[int, EventSource, int]
"""`(SOURCE, source, estimated bytes)`: serialized bytes, or a function the sender thread calls for them."""
QueuedSummary = tuple[int, bytes, int, float, int]
"""`(SUMMARY, serialized Summary, step, wall_time, estimated bytes)`: the sender thread builds the event
(`_encoder`)."""
QueuedScalar = tuple[int, str, float, int, float, int]
"""`(SCALAR, tag, value, step, wall_time, estimated bytes)`: built into an event, or sent as columns
(`_columns`)."""
Queued = QueuedSource | QueuedSummary | QueuedScalar
# Their lengths differ (3, 5, 6), and the sender thread relies on it: only a scalar has a sixth field, so summing
# that field over a run tells whether the run is all scalars (`EventQueue.take_scalars`).

FAST_ITEM_BYTES = 256
"""The largest event (estimated bytes) a caller queues without the lock: a scalar or a small summary. Larger
ones take the lock and are counted exactly against the memory bound."""


@dataclass(eq=False)
class Batch:
    """Numbered events `first .. first + count - 1`, in memory (`events`) or in the spool (`span`).

    A batch of scalars for a daemon that takes columns holds them as `scalars` (and `events` empty) until
    something needs their bytes (`encoded`: the spool, a refusal, an older daemon).

    Its fields change only through its methods, which the batch log and the spiller call holding the lock.
    """

    first: int
    count: int
    nbytes: int
    events: list[bytes] | None
    span: tuple[int, int] | None = None
    done: int = 0  # leading events the daemon acknowledged already (an ack inside this batch)
    sent_at: float = 0.0
    settled: bool = False
    scalars: ScalarRun | None = None
    counted: bool = False  # the ledger counted it delivered already: acknowledged, then kept until durable

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    @property
    def pending(self) -> int:
        """Events of this batch not acknowledged yet."""
        return self.count - self.done

    def acknowledge_through(self, sequence: int) -> int:
        """The daemon acknowledged up to `sequence` inside this batch; the number of events newly acknowledged."""
        newly = max(0, min(sequence, self.last) - self.first + 1 - self.done)
        self.done += newly
        return newly

    def settle(self) -> None:
        self.settled = True

    def renumber(self, first: int) -> None:
        """Numbered anew from `first` after a refusal (the daemon wrote none of it)."""
        self.first, self.done = first, 0

    def sent(self, now: float) -> None:
        self.sent_at = now

    def spilled(self, span: tuple[int, int]) -> None:
        """Its events are in the spool at `span` now, no longer in memory."""
        self.events, self.span = None, span

    def loaded(self, events: list[bytes]) -> None:
        """Read back from the spool: the events not yet acknowledged, in memory, numbered from the first of them."""
        self.first, self.count, self.done = self.first + self.done, len(events), 0
        self.events, self.span, self.nbytes = events, None, sum(map(len, events))

    def encoded(self) -> list[bytes] | None:
        """Its events' bytes (None when spilled), scalars built into events for good."""
        if self.scalars is not None:
            self.events, self.scalars = self.scalars.encoded(), None
        return self.events

    def without(self, index: int) -> None:
        """Drop event `index` (the one the daemon refused) and those acknowledged already; in memory only."""
        self.encoded()
        assert self.events is not None
        kept = self.events[self.done : index] + self.events[index + 1 :]
        self.events, self.count, self.nbytes, self.done = kept, len(kept), sum(map(len, kept)), 0


def size_known(item: Queued) -> bool:
    """Whether a queued event's estimated size is (about) its size: serialized bytes and plain values are;
    a function's estimate may be far off until it has run."""
    return item[0] != SOURCE or isinstance(item[1], bytes)
