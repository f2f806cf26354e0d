"""The sender's accounts: what became of every event the caller handed over."""

from __future__ import annotations

from collections import Counter

from summaryd.client._sender._queue import EventQueue
from summaryd.client._sender._report import DeliveryReport

DELIVERED = "delivered"


class Ledger:
    """Counts how each accepted event was settled: delivered, or dropped for a reason; and how many of those not
    yet settled are safe in the spool. The queue counts what it accepted (on the caller's hot path, one count in
    one place). Every change holds the sender's lock."""

    def __init__(self, queue: EventQueue) -> None:
        self._queue = queue
        self.settled = 0
        self.delivered = 0
        self.spooled = 0
        self.dropped: Counter[str] = Counter()

    @property
    def accepted(self) -> int:
        return self._queue.accepted

    @property
    def unsettled(self) -> int:
        return self._queue.accepted - self.settled

    def refuse(self, reason: str) -> None:
        """An event the caller offered and the sender did not accept (closed, queue full): counted, not owed."""
        self.dropped[reason] += 1

    def settle(self, count: int, reason: str, *, spooled: bool = False) -> None:
        """`count` accepted events are done with: `DELIVERED`, or dropped for `reason`; `spooled` when they were
        counted in the spool."""
        if count <= 0:
            return
        self.settled += count
        if reason == DELIVERED:
            self.delivered += count
        else:
            self.dropped[reason] += count
        if spooled:
            self.spooled -= count

    def unsettle(self, count: int) -> None:
        """`count` events settled as delivered are owed again: the daemon may have lost them before they were
        uploaded (`BatchLog.doubt_kept`)."""
        self.settled -= count
        self.delivered -= count

    def spool(self, count: int) -> None:
        """`count` unsettled events were written to the spool."""
        self.spooled += count

    def unspool(self, count: int) -> None:
        """`count` spooled events were read back into memory."""
        self.spooled -= count

    def report(self, *, synced: bool, error: str | None, spool_path: str | None) -> DeliveryReport:
        return DeliveryReport(
            delivered=self.delivered,
            undelivered=self.unsettled,
            dropped=dict(self.dropped),
            synced=synced,
            error=error,
            spooled=self.spooled,
            spool_path=spool_path if self.spooled else None,
        )
