"""What the caller's queue and the sender's log hold."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# An event to send: its serialized bytes, a scalar, or a function that builds them on the sender thread (so
# that no encoding, PNG or protobuf, runs on the caller's thread).
EventSource = bytes | Callable[[], bytes]

# What the queue holds: `(source, estimated bytes)`, or the plain values of a scalar or of a serialized summary
# that the sender thread turns into an event (see `_encoder`).
Queued = tuple[EventSource, int] | tuple[bytes, int, float, int] | tuple[str, float, int, float, int]


@dataclass(eq=False)
class Batch:
    """Numbered events `first .. first + count - 1`, in memory (`events`) or in the spool (`span`)."""

    first: int
    count: int
    nbytes: int
    events: list[bytes] | None
    span: tuple[int, int] | None = None
    done: int = 0  # leading events the daemon acknowledged already (an ack inside this batch)
    sent_at: float = 0.0
    settled: bool = False

    @property
    def last(self) -> int:
        return self.first + self.count - 1


def size_known(item: Queued) -> bool:
    """Whether a queued event's estimated size is (about) its size: serialized bytes and plain values are;
    a function's estimate may be far off until it has run."""
    return len(item) != 2 or isinstance(item[0], bytes)
