"""The caller's queue: a deque callers append to without a lock while there is room, and what the sender's side
knows of it (how much it holds, what to take next)."""

from __future__ import annotations

import sys
import time
from bisect import bisect_left
from collections import deque
from itertools import accumulate, islice, repeat, starmap
from operator import countOf, itemgetter

from summaryd.client._sender._items import FAST_ITEM_BYTES, Queued, size_known
from summaryd.client._sender._kinds import SCALAR, SOURCE, SUMMARY


class EventQueue:
    """A deque of queued events, which callers append to without a lock while there is room (`fast_until`),
    and what the sender's side knows of it. Everything but `Sender.enqueue`'s append and its reads of
    `inbox` and `alert` holds the sender's lock.

    A caller appends without the lock, then compares the queue's length with `alert` and calls in to the sender
    (`Sender.appended`) only when it is reached: one comparison after the append decides everything, because
    `alert` is the least of the counts at which a caller must: past the lock-free room (`fast_until + 1`), and
    the count the sender thread asked to be woken at (`wake_at`: the first event while it sleeps on an empty
    queue, a full batch while it lingers, never while it is busy and looks at the queue again anyway).

    Why the lock-free append is safe (the GIL may switch threads between any two bytecodes; `deque.append`,
    `popleft`, `extendleft`, `len`, an index and `del` at an index are each one C call, so they are atomic):
    - Only holders of the lock take events off, and only from the left; callers only append on the right. So
      under the lock the positions of the queued events are stable, and `accepted = taken + len(items)` (read
      under the lock) counts every event appended so far exactly once, without the caller counting anything.
    - Bytes are counted lazily, under the lock: `_counted` leading events are in `_counted_bytes`; those appended
      since are summed in one C-level pass over an `islice` (`nbytes`) when someone needs the figure.
    - `fast_until` is a count the queue's length after a caller's append is compared with (through `alert`): it
      leaves room for `fast_until - len` more events of at most `FAST_ITEM_BYTES` each within the memory bound.
      The sender updates it and callers read `alert` in separate steps, so threads racing there may each put
      one event past it: the bound holds to within one event per logging thread. A caller that finds its append
      past the room takes it back and queues it under the lock, by the overflow policy (unless the sender took
      it already).
    - No wake-up is lost: the sender thread sets `wake_at` (`arm`) and then looks at the queue's length once
      more; a caller reads `alert` after its append. So an append the sender's second look missed reads the
      new `alert`.
    """

    def __init__(self) -> None:
        self.items: deque[Queued] = deque()
        # What callers append to: `items`, until the sender stops accepting; then a deque of its own, so that an
        # event appended while it closes is never among those it delivers, drops or clears, only taken back.
        self.inbox = self.items
        self.taken = 0  # events taken off the queue (into batches, dropped, or given up): accepted - queued
        self._counted = 0
        self._counted_bytes = 0
        self._large_bytes = 0  # of events over FAST_ITEM_BYTES queued (under the lock) since the last count
        self.queued_at = 0.0  # when the oldest event of the next batch arrived (what linger counts from)
        self.room_wanted = 0  # bytes a caller waits to queue (policies spill and block)
        self.fast_until = 0  # callers append without the lock while fewer events are queued (0: never)
        self.wake_at = NEVER  # the count at which the sender thread wants a caller to wake it (NEVER: it is busy)
        self.alert = 0  # a caller whose append leaves this many queued calls in: min(fast_until + 1, wake_at)
        self.send_now_until = 0  # events accepted before this count are sent without lingering (`flush()`)

    @property
    def lingering(self) -> bool:
        """Whether the next batch may wait for more events: not while some a `flush()` asked to send remain."""
        return self.taken >= self.send_now_until

    def __len__(self) -> int:
        return len(self.items)

    @property
    def accepted(self) -> int:
        """Events ever queued: what the sender owes the caller an account of."""
        return self.taken + len(self.items)

    @property
    def nbytes(self) -> int:
        """Estimated bytes of the queued events."""
        items = self.items
        end = len(items)
        if end > self._counted:
            # One C-level pass over the events appended since the last count. No Python code runs inside it, so
            # this thread keeps the GIL throughout and no caller can append under the iterator. (Not by index:
            # a deque's `items[i]` walks its blocks from the nearer end, so a count by index over a long queue
            # cost time quadratic in its length.)
            try:  # all scalars, the usual queue: their size by the quicker index (see `_SCALAR_SIZE`)
                self._counted_bytes += sum(map(_SCALAR_SIZE, islice(items, self._counted, end)))
            except IndexError:
                self._counted_bytes += sum(map(_SIZE, islice(items, self._counted, end)))
            self._counted = end
            self._large_bytes = 0
        return self._counted_bytes

    def under(self, nbytes: int) -> bool:
        """Whether the queued events take fewer than `nbytes`: decided from an upper bound when it can be
        (those counted, and `FAST_ITEM_BYTES` for each appended since, plus the larger ones), so that the
        sender's checks of the budget do not count every event the caller appends."""
        bound = self._counted_bytes + (len(self.items) - self._counted) * FAST_ITEM_BYTES + self._large_bytes
        return bound < nbytes or self.nbytes < nbytes

    def append(self, item: Queued) -> None:
        """Queue `item` holding the lock (`Sender.enqueue` appends a small one without it)."""
        self.items.append(item)
        if item[-1] > FAST_ITEM_BYTES:
            self._large_bytes += item[-1]

    def _set_fast(self, fast_until: int) -> None:
        self.fast_until = fast_until
        self.alert = min(fast_until + 1, self.wake_at)

    def arm(self, full: int) -> bool:
        """Before the sender thread waits: have callers wake it at the first event (nothing queued) or at a full
        batch of `full` (some queued); not at all when a full batch waits already (only an acknowledgement lets it
        go). False when an event arrived meanwhile: the thread looks at the queue again instead of waiting."""
        queued = len(self.items)
        self.wake_at = 1 if not queued else full if queued < full else NEVER
        self._set_fast(self.fast_until)
        return len(self.items) == queued

    def disarm(self) -> None:
        """The sender thread is awake: it looks at the queue before it waits again, and needs no wake-up."""
        self.wake_at = NEVER
        self._set_fast(self.fast_until)

    def _popped(self, count: int, nbytes: int) -> None:
        """`count` events of `nbytes` were taken from the left."""
        self.taken += count
        self._set_fast(self.fast_until - count)  # fewer queued, the same room: as many more as before
        if count >= self._counted:
            self._counted = self._counted_bytes = 0
        else:
            self._counted -= count
            self._counted_bytes -= nbytes

    def open_fast(self, left: int, accepting: bool) -> None:
        """Let callers append without the lock as many small events as the `left` bytes of the bound take besides
        the queued ones (none while a caller waits for room, or when the sender no longer accepts).

        The queued events are counted exactly only near the bound (`_EXACT_WITHIN` of it): farther, their upper
        bound (those not counted yet at `FAST_ITEM_BYTES` each) leaves room enough, and no pass over every
        event appended since the last count is made."""
        if not accepting or self.room_wanted:
            self._set_fast(0)
            return
        end = len(self.items)
        room = left - (self._counted_bytes + (end - self._counted) * FAST_ITEM_BYTES + self._large_bytes)
        if room < _EXACT_WITHIN:
            room = left - self.nbytes
            end = self._counted
        self._set_fast(end + room // FAST_ITEM_BYTES if room >= FAST_ITEM_BYTES else 0)

    def stop_taking(self) -> None:
        """The sender no longer accepts events: every caller calls in from now on, and what callers append goes
        to a deque of its own, which they take it back from (`take_back`)."""
        self._set_fast(0)
        if self.inbox is self.items:
            self.inbox = deque()

    def fast_room(self) -> int:
        """How many more small events callers may append without the lock."""
        return self.fast_until - len(self.items)

    def take_run(self, max_events: int, max_bytes: int, scalars_apart: bool = False) -> list[Queued]:
        """Pop the next events of a batch: a run of those whose size is known, so that the lock is taken once
        per run, not per event; a function alone, since only encoding it tells its size. `scalars_apart`: stop
        before a scalar (they go as columns, `take_scalars`)."""
        queue = self.items
        if not queue or (scalars_apart and queue[0][0] == SCALAR):
            return []
        first = queue.popleft()
        items = [first]
        room = max_bytes - first[-1]
        if size_known(first):
            while queue and len(items) < max_events and room > 0:
                head = queue[0]
                if not size_known(head) or (scalars_apart and head[0] == SCALAR):
                    break
                items.append(queue.popleft())
                room -= head[-1]
        self._popped(len(items), max_bytes - room)
        self.queued_at = time.monotonic()
        return items

    def take_scalars(self, max_events: int, max_bytes: int) -> tuple[list[Queued], int, str | None]:
        """Pop the run of scalars at the head of the queue (at most `max_events`, about `max_bytes`: the event
        that crosses it is the last taken), their estimated bytes, and their one tag when they have one.

        Every step is a C-level pass over the run (no Python per event). The events are popped first and those
        past the run put back on the left: no iterator over the deque, which a caller's append would invalidate.
        """
        queue = self.items
        head = list(starmap(queue.popleft, repeat((), min(max_events, len(queue)))))
        count = len(head)
        if not count:
            return head, 0, None
        first = head[0]
        tag = first[1]
        if first[0] == SCALAR and head[-1][1] == tag and countOf(map(_TAG, head), tag) == count:
            # The usual run: one tag throughout, so all scalars (only a scalar's second field is a `str`), each of
            # the same estimated bytes (a function of the tag). Summed one by one only when the lazy count needs
            # exactly those popped (`_popped`) or the run may be over `max_bytes`.
            nbytes = count * first[-1]
            if count < self._counted or nbytes > max_bytes:
                nbytes = sum(map(_SCALAR_SIZE, head))
            one_tag: str | None = tag  # type: ignore[assignment]
        else:
            # The first event of another kind ends the run. Only a scalar's tuple has a sixth field, so the sum of
            # the sizes (that field) tells a run of scalars with no pass over the kinds: another kind's tuple
            # raises `IndexError` there.
            one_tag = None
            try:
                nbytes = sum(map(_SCALAR_SIZE, head))
            except IndexError:
                kinds = list(map(_KIND, head))
                count = min(kinds.index(other) for other in _NOT_SCALAR if other in kinds)
                queue.extendleft(reversed(head[count:]))
                del head[count:]
                nbytes = sum(map(_SCALAR_SIZE, head))
            if not count:
                return head, 0, None
        if nbytes > max_bytes:  # rare: cut where the sizes cross `max_bytes`
            ends = list(accumulate(map(_SCALAR_SIZE, head)))
            cut = bisect_left(ends, max_bytes) + 1
            if cut < count:
                queue.extendleft(reversed(head[cut:]))  # before the other kinds put back above
                del head[cut:]
                count, nbytes = cut, ends[cut - 1]
        self._popped(count, nbytes)
        self.queued_at = time.monotonic()
        return head, nbytes, one_tag

    def drop_oldest(self) -> None:
        self._popped(1, self.items.popleft()[-1])

    def clear(self) -> int:
        """Forget every queued event; how many there were."""
        count = len(self.items)
        for _ in starmap(self.items.popleft, repeat((), count)):
            pass
        self._popped(count, 0)
        return count

    def take_back(self, item: Queued) -> bool:
        """Take `item` (or one equal to it) back off the queue, if no one took it yet: a caller that appended it
        while the sender stopped accepting refuses it, one past the lock-free room queues it under the lock."""
        if self.inbox is not self.items and _taken_back(self.inbox, item):
            return True
        return _taken_back(self.items, item)

    def want_room(self, nbytes: int) -> None:
        """A caller waits to queue `nbytes` (0: no longer): the budget counts them already, and the other callers
        queue under the lock meanwhile."""
        self.room_wanted = nbytes
        if nbytes:
            self._set_fast(0)


NEVER = sys.maxsize
"""A count no queue reaches: `wake_at` while the sender thread is awake."""

_EXACT_WITHIN = 8 * 1024 * 1024
"""Bytes from the memory bound within which `open_fast` counts the queued events exactly."""

_RECENT = 64
"""How many of the last events `take_back` looks among before it looks at all of them."""

_NOT_SCALAR = (SUMMARY, SOURCE)
"""The other queued kinds (see `_items.Queued`)."""

_KIND = itemgetter(0)
"""A queued event's kind."""

_TAG = itemgetter(1)
"""A queued scalar's tag."""

_SIZE = itemgetter(-1)
"""A queued event's estimated bytes."""

_SCALAR_SIZE = itemgetter(5)
"""A queued scalar's estimated bytes: its last field by a non-negative index, which `itemgetter` reads from a
tuple without the generic lookup a negative one takes; the other kinds' tuples are shorter (`_items`)."""


def _taken_back(items: deque[Queued], item: Queued) -> bool:
    """Whether `item` (or one equal to it) was in `items`, taken out now. Holding the sender's lock."""
    # Looked for among the last few first: it was appended a moment ago, only by other callers since, and
    # `remove` compares from the left, every event of a long queue.
    try:
        index = items.index(item, max(0, len(items) - _RECENT))
    except ValueError:
        try:
            items.remove(item)
        except ValueError:
            return False
        return True
    del items[index]  # a rotation of the few events after it; the positions before it are the lock's
    return True
