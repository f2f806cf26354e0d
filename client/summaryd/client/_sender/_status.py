"""Where a sender stands: closing or failed, the last error, and warnings at a limited rate."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("summaryd.client")

_WARN_EVERY = 10.0


class Warnings:
    """Logs a warning at most once per reason every 10 s, so that a daemon away does not flood the log."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def warn(self, reason: str, message: str) -> None:
        now = time.monotonic()
        if now - self._last.get(reason, -_WARN_EVERY) >= _WARN_EVERY:
            self._last[reason] = now
            log.warning("summaryd: %s", message)

    def forget(self, reason: str) -> bool:
        """Whether the user was warned for `reason` (which may be warned about again at once from now on)."""
        return self._last.pop(reason, None) is not None


class Status:
    """The lifecycle (closing, closed, told to spill everything, synced, failed) and the last error. Changes
    hold the sender's lock, except the lone flag writes a thread may race harmlessly."""

    def __init__(self) -> None:
        self.closing = False
        self.accepting = True  # neither closing nor failed: what a caller that calls in asks, in one look
        self.closed = False
        self.close_deadline = float("inf")
        self.spill_all = False  # close() is running out of time: everything goes to the spool now
        self.synced = False
        self.failed: str | None = None
        self.last_error: str | None = None
        # Whether `last_error` is the kind a later success overcomes (the daemon away, an ack overdue): then a
        # session that opens again clears it, and the report does not blame what was in the end delivered.
        self.error_passing = False
        self.warnings = Warnings()

    @property
    def error(self) -> str | None:
        """What the report blames: a permanent failure, else the last error not overcome since."""
        return self.failed or self.last_error

    def begin_close(self, deadline: float) -> None:
        if not self.closing:
            self.closing = True
            self.accepting = False
            self.close_deadline = deadline

    def finish_close(self) -> None:
        self.closed = True

    def spill_everything(self) -> None:
        self.spill_all = True

    def fail(self, reason: str) -> None:
        self.failed = reason
        self.accepting = False

    def confirm_synced(self) -> None:
        self.synced = True

    def note_error(self, text: str, *, passing: bool) -> None:
        self.last_error = text
        self.error_passing = passing

    def overcome(self) -> bool:
        """A session opened again: an error that passes is no longer the reason for anything; whether there was."""
        if not self.error_passing:
            return False
        self.last_error = None
        self.error_passing = False
        return True
