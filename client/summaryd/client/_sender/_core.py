"""What the parts of one sender share, made once and handed to each: its settings, its session's identity,
one lock, the caller's queue, the accounts, the batch log, the status and the memory budget."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from summaryd.client._options import ClientOptions
from summaryd.client._sender._batch_log import BatchLog
from summaryd.client._sender._budget import MemoryBudget
from summaryd.client._sender._ledger import Ledger
from summaryd.client._sender._queue import EventQueue
from summaryd.client._sender._status import Status
from summaryd.client._spool import SpoolIdentity


@dataclass(frozen=True, eq=False)
class SenderCore:
    """The state of one sender in one process (a forked child makes its own, never using the parent's).

    `lock` is the one lock of every part (re-entrant: the SIGTERM handler may close the sender while the
    interrupted caller holds it) and `cond` its condition; `wake` wakes the sender thread, `abandon` tells it
    to stop now, and `encoding` is held while an event is encoded on it (a fork waits for it, see
    `_process._fork`). `outbox_pid`: in a child forked from a process that used gRPC, the ancestor whose
    courier delivers this sender's outbox (it never uses gRPC itself).
    """

    options: ClientOptions
    identity: SpoolIdentity
    outbox_pid: int | None
    lock: threading.RLock
    cond: threading.Condition
    wake: threading.Event
    abandon: threading.Event
    encoding: threading.Lock
    queue: EventQueue
    ledger: Ledger
    batches: BatchLog
    status: Status
    budget: MemoryBudget

    @classmethod
    def make(cls, options: ClientOptions, identity: SpoolIdentity, outbox_pid: int | None = None) -> SenderCore:
        lock = threading.RLock()
        queue = EventQueue()
        ledger = Ledger(queue)
        batches = BatchLog(ledger)
        return cls(
            options=options,
            identity=identity,
            outbox_pid=outbox_pid,
            lock=lock,
            cond=threading.Condition(lock),
            wake=threading.Event(),
            abandon=threading.Event(),
            encoding=threading.Lock(),
            queue=queue,
            ledger=ledger,
            batches=batches,
            status=Status(),
            budget=MemoryBudget(options.max_queue_bytes, queue, batches),
        )


class SenderPart:
    """A part of a sender (the spiller, the connection, the thread's loop): it keeps what it uses of the core as
    plain attributes, read with one lookup each on the sender thread."""

    def __init__(self, core: SenderCore) -> None:
        self._options = core.options
        self._identity = core.identity
        self._outbox_pid = core.outbox_pid
        self._lock = core.lock
        self._cond = core.cond
        self._wake = core.wake
        self._abandon = core.abandon
        self._queue = core.queue
        self._ledger = core.ledger
        self._batches = core.batches
        self._status = core.status
        self._budget = core.budget
