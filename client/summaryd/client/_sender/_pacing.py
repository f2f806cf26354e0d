"""The daemon's pacing, as the sender follows it: how long a partial batch lingers, how many batches fly.

The daemon states its pacing when a session opens and in an ack whenever it changes (`summaryd.v1.Pacing`):
under a big job it asks every client to let partial batches wait longer, so that it gets fewer, larger messages
(its cost is per message, not per scalar). The sender follows it within the user's bound
(`ClientOptions.max_linger_secs`) and never below the user's own `linger_secs`; a daemon that says nothing
(0, or an older daemon) leaves the client's own settings. A flush, a close or an end never waits out a linger:
the sender sends those at once whatever the pacing says (`_queue.QueuedEvents.lingering`).
"""

from __future__ import annotations

import math

from summaryd.client._options import ClientOptions


class Pacing:
    """The linger and in-flight window in force: the client's own, or the daemon's within the client's bounds.

    Written by the stream's thread (`advise`, from an ack), read by the sender thread: each figure is one
    attribute, replaced whole.
    """

    def __init__(self, options: ClientOptions) -> None:
        self._options = options
        self.linger_secs = options.linger_secs
        self.max_in_flight = options.max_in_flight

    def advise(self, linger_seconds: float, max_in_flight: int) -> None:
        """Follow what the daemon said (0: the client's own setting)."""
        options = self._options
        linger = options.linger_secs
        if math.isfinite(linger_seconds) and linger_seconds > linger:
            linger = min(linger_seconds, max(options.max_linger_secs, linger))
        self.linger_secs = linger
        self.max_in_flight = min(max_in_flight, options.max_in_flight) if max_in_flight > 0 else options.max_in_flight
