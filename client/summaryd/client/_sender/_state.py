"""What every layer of the sender reads: its settings and the state of one process."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import Counter, deque
from pathlib import Path
from typing import Literal

import grpc

from summaryd.client import _process
from summaryd.client._batch_fit import DaemonLimits
from summaryd.client._channel import ChannelSettings
from summaryd.client._encoder import EventEncoder
from summaryd.client._sender._items import Batch, Queued
from summaryd.client._spool import Spool
from summaryd.client._stream import WriteStream
from summaryd.v1 import summaryd_pb2 as pb

log = logging.getLogger("summaryd.client")

Overflow = Literal["spill", "drop_oldest", "block"]
OVERFLOW_POLICIES: tuple[Overflow, ...] = ("spill", "drop_oldest", "block")

_WARN_EVERY = 10.0


# Failures that a later successful call overcomes: the daemon was away, restarting or slow.
_PASSING = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})


class SenderState:
    """The settings (`Sender.__init__` sets them) and the per-process state (`_init_state`) of a sender, and
    the few questions about them that every layer asks."""

    run: str
    address: str
    channel_settings: ChannelSettings
    worker: str
    world_size: int
    framework: str
    max_queue_bytes: int
    max_batch_events: int
    max_batch_bytes: int
    linger_secs: float
    rpc_timeout: float
    max_in_flight: int
    backoff_secs: tuple[float, float]
    close_timeout: float
    overflow: Overflow
    block_secs: float | None
    spool_root: Path
    spool_enabled: bool
    spool_after: float
    heartbeat_secs: float

    def _init_state(self) -> None:
        """Everything that belongs to one process; a forked child builds it anew (never the parent's channel)."""
        self._pid = os.getpid()
        # In a child forked from a process that used gRPC: never use gRPC, write to an outbox instead.
        self._outbox_pid = _process.outbox_owner()
        self.session_id = str(uuid.uuid4())
        # Sent when opening the session: a daemon that lost state refuses to resume sessions older than the loss.
        self.session_started = time.time()
        self.run_dir: str | None = None
        # Re-entrant: the SIGTERM handler may close the sender while the interrupted caller holds the lock.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._abandon = threading.Event()
        # Held while an event is encoded on the sender thread; a fork waits for it (see `_process`).
        self._encoding = threading.Lock()
        # The caller's side: events not yet numbered.
        self._queue: deque[Queued] = deque()
        self._encoder = EventEncoder()  # sender thread only
        self._queued_bytes = 0
        self._room_wanted = 0  # bytes a caller waits to queue (policies spill and block)
        self._queued_at = 0.0
        # The sender's side: numbered batches not yet acknowledged, oldest first; spilled ones form a prefix.
        self._log: deque[Batch] = deque()
        self._held_bytes = 0
        self._held_events = 0
        self._next_sequence = 1
        self._acked = 0
        # The first `_in_flight` batches of the log were sent on the current stream (at most `max_in_flight`).
        self._in_flight = 0
        self._progress_at = time.monotonic()
        # Counters.
        self._accepted = 0
        self._settled = 0
        self._delivered = 0
        self._spooled = 0
        self._dropped: Counter[str] = Counter()
        # Lifecycle.
        self._closing = False
        self._closed = False
        self._spill_all = False
        self._synced = False
        self._failed: str | None = None
        self._last_error: str | None = None
        # Whether `_last_error` is the kind a later success overcomes (the daemon away, an ack overdue): then a
        # session that opens again clears it, and the report does not blame what was in the end delivered.
        self._error_passing = False
        self._refused: str | None = None
        self._refused_sequence: int | None = None  # the event the daemon named, if it did
        self._warned: dict[str, float] = {}
        self._close_deadline = float("inf")
        self._thread: threading.Thread | None = None
        # Connection (sender thread only).
        self._channel: grpc.Channel | None = None
        self._stream: WriteStream | None = None
        self._opening: grpc.Future[pb.OpenSessionResponse] | None = None
        self._next_attempt = 0.0
        self._backoff = self.backoff_secs[0]
        self._connect_failed = False
        self._lease = float("inf")
        self._daemon_limits = DaemonLimits()
        self._last_sent = 0.0
        # Spool (sender thread only).
        self._spool: Spool | None = None
        self._spool_error: str | None = None
        self._told_spool = False

    def _over_budget(self, nbytes: int = 0) -> bool:
        return self._queued_bytes + self._held_bytes + max(nbytes, self._room_wanted) > self.max_queue_bytes

    def _can_spool(self) -> bool:
        return (self.spool_enabled or self._outbox_pid is not None) and self._spool_error is None

    def _sender_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _warn(self, reason: str, message: str) -> None:
        now = time.monotonic()
        if now - self._warned.get(reason, -_WARN_EVERY) >= _WARN_EVERY:
            self._warned[reason] = now
            log.warning("summaryd: %s", message)

    def _note_error(self, exc: BaseException) -> None:
        text = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.RpcError) else repr(exc)
        self._last_error = text
        self._error_passing = isinstance(exc, grpc.RpcError) and exc.code() in _PASSING
        # Say what becomes of the events, so that the line is not read as data lost.
        then = "; the events are kept and sent when it answers" if self._error_passing else ""
        self._warn("daemon", f"daemon at {self.address} for run {self.run!r}: {text}{then}")
