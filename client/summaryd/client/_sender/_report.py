"""What a sender tells its caller about the events it accepted."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeliveryReport:
    """What became of the events a sender accepted, as `flush()` and `close()` return it."""

    delivered: int
    """Events the daemon acknowledged (written to the run's event file)."""
    undelivered: int
    """Events accepted but not acknowledged when the call returned (queued, in flight, or spooled)."""
    dropped: Mapping[str, int] = field(default_factory=dict)
    """Events given up, by reason: `queue_full`, `encode_error`, `rejected`, `closed`, `timeout`,
    `spool_failed`; and from `SummaryWriter`, `files` (projector files not uploaded)."""
    synced: bool = False
    """True when the daemon confirmed every delivered event is fsynced (after `close`)."""
    error: str | None = None
    """The last error the daemon or the connection reported, unless it was overcome since (the daemon was away
    or slow, and a session opened again): the reason behind what was not delivered, else None."""
    spooled: int = 0
    """Of `undelivered`, the events safe in the local spool: `summaryd replay <spool_path>` delivers them."""
    spool_path: str | None = None
    """The spool directory of this session, while it holds events (else its files spool, while that holds
    files)."""
    files_spooled: int = 0
    """From `SummaryWriter`: projector files the daemon did not take, kept in the session's files spool
    (`<spool_path>.files`, or `spool_path` itself when no events are spooled) for `summaryd replay`."""

    @property
    def ok(self) -> bool:
        """Everything accepted was delivered and nothing was dropped."""
        return self.undelivered == 0 and not self.files_spooled and not any(self.dropped.values())
