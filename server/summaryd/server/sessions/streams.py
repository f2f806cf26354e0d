"""The write streams open and how many wait for their batch's write: what tells a busy group commit that no more
batches can come before it goes."""

from __future__ import annotations


class WriteStreams:
    """Counts the write streams open (a client's `Write`; a relay's `Relay`, however many sessions it carries, is
    one), those whose batch or message waits for its write, and the relay messages among them. A stream reads its
    next message only once this one is answered, so a busy commit that waits for more batches
    (`storage.runs.GroupCommit`) goes as soon as waiting cannot bring any: when every open stream waits (one
    client's back-to-back batches never wait out a tick), or when a relay's message does (a group already,
    gathered from many sessions; its stream's next message waits for it, so a tick would cap the relay's rate).
    The service changes the counts; they are plain numbers the event loop alone touches."""

    def __init__(self) -> None:
        self.open = 0
        self.waiting = 0
        self.relayed = 0

    def commit_now(self) -> bool:
        """Whether a busy commit goes without waiting out its tick (see the class)."""
        return self.relayed > 0 or self.waiting >= self.open
