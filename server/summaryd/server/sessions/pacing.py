"""The daemon's pacing of its clients: fewer, larger messages when many busy streams would send too many.

The daemon's cost is per message (gRPC's Python side, the session's turn, a write and a journal line), hardly
per scalar. A job of N ranks each sending a batch per step sends N x steps/s messages whatever they hold; the
daemon counts the messages it takes and, once their rate passes half of `--pace-messages` a second, asks every
client to let a partial batch linger about `streams / pace` seconds (so that the open streams together send
about `--pace-messages` a second) and to keep at most `PACED_IN_FLIGHT` batches in flight. It says so in each
`OpenSessionResponse` and, when it changes, in the next ack of every stream (`summaryd.v1.Pacing`). Below a
quarter of the rate it lifts the pacing (0: the clients' own settings), so that at low load nothing changes
but, from `MANY_STREAMS` streams on, the window of batches in flight.
The linger is one of `LINGER_STEPS` (whole seconds beyond them), so that it changes seldom: the first step that
keeps the streams within `LINGER_SLACK` of the pace (the steps are up to 1.5x apart: rounding `streams / pace` up
to the next would add up to half of it to every scalar's visibility, to save a few messages a second). It is at
most `--pace-max-linger` (2 s): the clients' visibility stays within it.

The messages taken are not the load offered: a daemon starved of CPU takes few messages a second because it gets
round to few, and would never pace the clients that swamp it. So the pacer also keeps time on the event loop
(`keep_time`): a loop that wakes `STARVED_LAG` late or more has more offered than it takes, and paces as if busy for
`STARVED_HOLD` seconds after (a hold, so that the calm its own pacing brings does not lift it at once).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import time
from collections.abc import Callable

from summaryd.v1 import summaryd_pb2 as pb

log = logging.getLogger(__name__)

LINGER_STEPS = (0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)
MAX_LINGER = 2.0
PACED_IN_FLIGHT = 2
# From this many write streams on, clients keep `PACED_IN_FLIGHT` batches in flight even before the daemon is
# busy: a thousand ranks' first steps, before their acks bring the pacing, are otherwise eight batches each
# queued in the daemon (seconds of backlog); at low load an ack comes back long before a third batch is due.
MANY_STREAMS = 64
# The pace is aimed at, not a wall: a linger that keeps the streams within a quarter over it is taken (1,024
# streams at 1,000 messages/s linger 1 s, not 1.5 s).
LINGER_SLACK = 1.25
WINDOW_SECS = 0.5
DEFAULT_PACE = 1000.0
TICK_SECS = 0.1
STARVED_LAG = 0.25
STARVED_HOLD = 10.0


class Pacer:
    """Counts the messages taken and the write streams open, and states the pacing they call for."""

    def __init__(
        self, pace: float = DEFAULT_PACE, max_linger: float = MAX_LINGER, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.pace = pace
        """Messages a second the daemon aims to take at most (`--pace-messages`; 0: never paces)."""
        self.max_linger = max_linger
        self._clock = clock
        self.streams = 0
        self.rate = 0.0
        """Messages a second over the last window."""
        self.pacing = pb.Pacing()
        self.version = 0
        """Counts the changes of `pacing`: a stream tells its client when the version it told is behind."""
        self._count = 0
        self._since = clock()
        self._starved_until = -math.inf
        """Until when the pacer paces as if busy: the event loop woke `STARVED_LAG` late or more (`keep_time`)."""

    def opened(self) -> None:
        self.streams += 1
        if self.streams == MANY_STREAMS:  # the window for many streams applies at once, not a window later
            self._reconsider()

    def closed(self) -> None:
        self.streams -= 1

    def took(self, messages: int = 1) -> None:
        """Messages taken (a batch, or a heartbeat; a relay's message counts its batches): once a window has
        passed, the pacing is reconsidered."""
        self._count += messages
        self._tick(self._clock())

    def lagged(self, lag: float) -> None:
        """The event loop woke `lag` seconds later than it asked: from `STARVED_LAG` on, more is offered than
        taken, and the pacing is reconsidered at once."""
        now = self._clock()
        if lag >= STARVED_LAG:
            starved = now >= self._starved_until
            self._starved_until = now + STARVED_HOLD
            if starved:
                log.info("pacing: the event loop woke %.2fs late: more is offered than the daemon takes", lag)
                self._reconsider()
        elif -math.inf < self._starved_until <= now:  # the hold is over: paced as the rate says again
            self._starved_until = -math.inf
            self._reconsider()
        # The rate is not re-measured here: a window with no message in it would lift the pacing between a
        # client's batches (told in the next heartbeat's ack), so the rate is measured when messages come.

    async def keep_time(self) -> None:
        """Until cancelled: how late the event loop wakes from a short sleep, told to `lagged`."""
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + TICK_SECS
            await asyncio.sleep(TICK_SECS)
            self.lagged(loop.time() - asked)

    def _tick(self, now: float) -> None:
        if now - self._since >= WINDOW_SECS:
            self.rate = self._count / (now - self._since)
            self._count, self._since = 0, now
            self._reconsider()

    def _reconsider(self) -> None:
        pace, paced = self.pace, self.pacing.linger_seconds > 0
        if pace <= 0:  # never paces
            return
        busy = self.rate > pace / (4 if paced else 2) or self._clock() < self._starved_until
        linger = 0.0
        if busy:
            wanted = self.streams / (pace * LINGER_SLACK)
            at = bisect.bisect_left(LINGER_STEPS, wanted)
            linger = min(LINGER_STEPS[at] if at < len(LINGER_STEPS) else float(math.ceil(wanted)), self.max_linger)
        in_flight = PACED_IN_FLIGHT if busy or self.streams >= MANY_STREAMS else 0
        if linger != self.pacing.linger_seconds or in_flight != self.pacing.max_in_flight:
            self.pacing = pb.Pacing(linger_seconds=linger, max_in_flight=in_flight)
            self.version += 1
            log.info(
                "pacing: %.0f messages/s over %d streams: clients %s",
                self.rate,
                self.streams,
                f"linger {linger:g}s, {in_flight} batches in flight" if linger else "use their own settings",
            )
