"""The batch log: events numbered into batches, kept until the daemon acknowledges them (and, from a daemon
on object storage, until it says they are uploaded)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator

from summaryd.client._sender._columns import ScalarRun
from summaryd.client._sender._items import Batch
from summaryd.client._sender._ledger import DELIVERED, Ledger


class BatchLog:
    """Numbered batches not yet acknowledged, oldest first, and what settles them: acknowledgements (an ack
    may end inside a batch), a refusal (of one event, or of the oldest batch), or giving up. Settled events go
    to the `Ledger`. Spilled batches (in the spool) form a prefix of the log, and the first `in_flight`
    batches were sent on the current stream. Every call holds the sender's lock."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._batches: deque[Batch] = deque()
        self.held_bytes = 0  # of the batches in memory
        self.held_events = 0  # unacknowledged events in memory
        self.next_sequence = 1
        self.acked = 0
        self.in_flight = 0
        # A daemon on object storage: acknowledged batches are kept (`_kept`) until `durable` covers them, and
        # sent again from there when another daemon resumes the session with less.
        self.keep_until_durable = False
        self.durable = 0
        self._kept: deque[Batch] = deque()
        self.kept_bytes = 0
        self.progress_at = time.monotonic()  # the last acknowledgement, or when there was nothing to wait for
        # A refusal the ack thread heard, for the sender thread to handle: the daemon's words and the event it
        # named, if it did.
        self._refusal: tuple[str, int | None] | None = None

    def __len__(self) -> int:
        return len(self._batches)

    @property
    def memory_bytes(self) -> int:
        """What the log holds in memory: unacknowledged batches and those kept until durable, both counted
        against `max_queue_bytes` (the overflow policy applies when they fill it)."""
        return self.held_bytes + self.kept_bytes

    def __iter__(self) -> Iterator[Batch]:
        return iter(self._batches)

    @property
    def head(self) -> Batch | None:
        return self._batches[0] if self._batches else None

    def append(self, events: list[bytes], nbytes: int, scalars: ScalarRun | None = None) -> Batch:
        """Number `events` (or `scalars`, as columns) as the next batch."""
        count = len(events) if scalars is None else len(scalars)
        batch = Batch(self.next_sequence, count, nbytes, events, scalars=scalars)
        self.next_sequence += count
        self._batches.append(batch)
        self.held_bytes += nbytes
        self.held_events += count
        return batch

    def nothing_pending(self, now: float) -> None:
        """The first event after a quiet spell: the wait for an acknowledgement starts now, not at the last ack."""
        if not self._batches:
            self.progress_at = now

    @property
    def resume_from(self) -> int:
        """The sequence number a session resumes from: after the durable ones when batches are kept for that."""
        return (self.durable if self.keep_until_durable else self.acked) + 1

    def resumed(self, last: int, durable_acks: bool) -> int:
        """A daemon opened the session holding up to `last`: kept batches it lacks are sent again (their events
        counted once, when first acknowledged). Return how many acknowledged events neither the daemon nor this
        log holds any more (the daemon lost them): the batches after them are numbered on from `last`, so that
        the session goes on without a gap."""
        self.keep_until_durable = self.keep_until_durable or durable_acks
        if last >= self.acked:
            return 0
        while self._kept and self._kept[-1].last > last:
            batch = self._kept.pop()
            self.kept_bytes -= batch.nbytes
            batch.settled, batch.done = False, 0
            self._batches.appendleft(batch)
            self.held_bytes += batch.nbytes
            self.held_events += batch.count
        self.acked = last
        start = self._batches[0].first if self._batches else self.next_sequence
        if start <= last + 1 or any(batch.events is None for batch in self._batches):
            return 0  # nothing missing; or spilled batches, whose numbers the spool holds: the daemon says the gap
        sequence = last + 1
        for batch in self._batches:
            batch.renumber(sequence)
            sequence += batch.count
        self.next_sequence = sequence
        return start - last - 1

    def doubt_kept(self, held: int) -> None:
        """The daemon holds the session only through `held` at the close (-1: it could not say by the close's
        deadline), so it may have lost the kept batches after that: they go back among the unacknowledged and
        are owed again, to be sent again when the session resumes, or spooled (or dropped) when the close gives
        up, never reported delivered."""
        held = max(held, self.durable)
        doubted = [batch for batch in self._kept if batch.last > held]
        for batch in doubted:
            batch.counted = False
        self._ledger.unsettle(sum(batch.count for batch in doubted))
        self.resumed(held, durable_acks=True)

    def _keep(self, batch: Batch) -> None:
        if batch.events is None or batch.last <= self.durable:  # spilled batches are not kept back from the spool
            return
        batch.counted = True
        self._kept.append(batch)
        self.kept_bytes += batch.nbytes

    def _durable_through(self, durable: int) -> None:
        self.durable = max(self.durable, durable)
        while self._kept and self._kept[0].last <= self.durable:
            self.kept_bytes -= self._kept.popleft().nbytes

    def acknowledge(self, acked: int, durable: int = 0) -> bool:
        """The daemon holds every event up to `acked` (and has uploaded up to `durable`): settle them as
        delivered. False when that is old news."""
        self._durable_through(durable)
        if acked <= self.acked:
            return False
        self.acked = acked
        self.progress_at = time.monotonic()
        while self._batches and self._batches[0].last <= acked:
            settled = self._settle_head(DELIVERED)
            self.in_flight = max(0, self.in_flight - 1)
            if self.keep_until_durable:
                self._keep(settled)
        head = self.head
        if head is not None and head.first <= acked:
            self._delivered(head, head.acknowledge_through(acked))
        return True

    def _delivered(self, batch: Batch, count: int) -> None:
        if batch.events is not None:
            self.held_events -= count
        if not batch.counted:
            self._ledger.settle(count, DELIVERED, spooled=batch.events is None)

    def _settle_head(self, reason: str) -> Batch:
        batch = self._batches.popleft()
        batch.settle()
        if batch.events is not None:
            self.held_bytes -= batch.nbytes
            self.held_events -= batch.pending
        if not batch.counted:
            self._ledger.settle(batch.pending, reason, spooled=batch.events is None)
        return batch

    def note_refusal(self, reason: str, sequence: int | None) -> None:
        """The daemon refused the oldest unacknowledged batch (and wrote none of it); handled by `refuse`."""
        self._refusal = (reason, sequence)

    def take_refusal(self) -> tuple[str, int | None] | None:
        refusal, self._refusal = self._refusal, None
        return refusal

    def refuse(self, sequence: int | None) -> tuple[int, bool]:
        """Drop what the daemon refused: the event it named, when it did and that event is in memory (the data
        itself is bad, a resend cannot help), else the whole oldest batch. Then number the rest on from the last
        acknowledged event, to be sent again. Spilled batches must be loaded first. How many events the
        refusal covered, and whether it named one."""
        head = self.head
        if head is None:
            return 0, False
        assert head.events is not None, "load spilled batches before handling a refusal"
        if sequence is not None and head.first + head.done <= sequence <= head.last:
            held = head.nbytes
            head.without(sequence - head.first)
            self.held_bytes -= held - head.nbytes
            self.held_events -= 1
            self._ledger.settle(1, "rejected")
            if not head.count:
                self._batches.popleft()
                head.settle()
            named = True
        else:
            self._settle_head("rejected")
            named = False
        sequence = self.acked + 1
        for batch in self._batches:
            batch.renumber(sequence)
            sequence += batch.count
        self.next_sequence = sequence
        return (1 if named else head.count), named

    def drop_all(self, reason: str) -> int:
        """Give up every batch (a permanent refusal); how many events that dropped."""
        dropped = 0
        while self._batches:
            dropped += self._settle_head(reason).pending
        self.in_flight = 0
        return dropped

    def in_memory_tail(self) -> list[Batch]:
        """The batches still in memory, oldest first (the spilled ones are the prefix before them)."""
        tail: list[Batch] = []
        for batch in reversed(self._batches):
            if batch.events is None:
                break
            tail.append(batch)
        tail.reverse()
        return tail

    def spilled(self, batch: Batch, span: tuple[int, int]) -> None:
        """`batch` is in the spool at `span` now: its memory is free, its events counted as spooled."""
        if batch.settled or batch.events is None:
            return
        batch.spilled(span)
        self.held_bytes -= batch.nbytes
        self.held_events -= batch.pending
        self._ledger.spool(batch.pending)

    def loaded(self, batch: Batch, events: list[bytes]) -> None:
        """A spilled `batch` read back: `events` are its unacknowledged ones."""
        batch.loaded(events)
        self._ledger.unspool(len(events))
        self.held_events += len(events)
        self.held_bytes += batch.nbytes

    def next_to_send(self, window: int) -> Batch | None:
        """The oldest batch not sent on this stream, while fewer than `window` are in flight."""
        # Sent batches are a prefix of the log, so the next one to send is right after them.
        if self.in_flight >= min(window, len(self._batches)):
            return None
        return self._batches[self.in_flight]

    def sent(self, batch: Batch) -> None:
        if not batch.settled:
            self.in_flight += 1

    def oldest_in_flight(self) -> Batch | None:
        return self._batches[0] if self._batches and self.in_flight else None

    def new_stream(self) -> None:
        """Nothing is in flight on a new (or no) stream: every unacknowledged batch is sent again."""
        self.in_flight = 0
