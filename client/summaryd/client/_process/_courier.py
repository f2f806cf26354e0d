"""The courier: delivers the outboxes of forked child processes through this process's gRPC.

gRPC does not survive `fork()` in a process whose threads are inside gRPC calls (a sender's ack thread always
is): a child that opens a channel of its own may stall for seconds or fail with "Closed on fork". So a child
forked from a process where the client used gRPC never touches gRPC (`_fork.outbox_owner`): its senders
append their numbered events to an *outbox*, a spool (`_spool`) under `<spool root>/children-of-<pid>/`, and
the courier thread of that ancestor process delivers it, resuming the child's own session with the child's
sequence numbers (so exactly once, like `summaryd replay`):

- while the child lives (it holds the outbox's lock) the courier sends what it has appended so far;
- once it has let go (closed its writer, or exited), the courier sends the rest, closes the session, and
  deletes the outbox (and the `children-of-<pid>` directory once no outbox is left in it, at `settle` and at
  exit);
- `settle` does the same at once for the runs of a writer the parent closes: its `close()` returns with what
  its exited children logged delivered and counted in its report (a child still running goes on logging, and
  the courier delivers it as it comes and at exit).

The courier talks to the daemons the child's outbox records (all its writer's addresses) as `summaryd replay`
does (`_failover.DaemonChannel`): one that is away gives way to the next, and one that names the run's owner
(a bucket logdir whose run another daemon writes) sends the courier there when that is one of those addresses
or of the redirect allow-list the outbox records; never anywhere else. An outbox the courier could not deliver
(the daemons were away until this process ended) stays on disk for `summaryd replay`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from summaryd.client._channel import ChannelSettings
from summaryd.client._options import ClientOptions
from summaryd.client._process import _fork
from summaryd.client._sender._batch_fit import DaemonLimits
from summaryd.client._sender._failover import DaemonChannel
from summaryd.client._sender._replay import open_request, send_events
from summaryd.client._sender._report import DeliveryReport
from summaryd.client._sender._targets import RedirectRefusedError
from summaryd.client._spool import MANIFEST, SpoolLockedError, lock, outbox_root, recorded_daemons, write_manifest
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1.wire import read_records

log = logging.getLogger("summaryd.client")

_POLL = 0.2
_TIMEOUT = 10.0


@dataclass
class _Outbox:
    """Delivery state of one child session's outbox."""

    path: Path
    manifest: dict[str, Any]
    offset: int = 0  # bytes of the outbox file read so far (whole records only)
    next_sequence: int = 0  # sequence number of the next record read
    seen: int = 0  # the highest `next_sequence` reached, kept across rewinds: what the child has logged so far
    acked: int = 0
    opened: bool = False
    limits: DaemonLimits = field(default_factory=DaemonLimits)  # what the daemon stated when the session opened


class Courier:
    """One per process; its thread starts after the first fork and polls the outbox roots."""

    def __init__(self) -> None:
        self._roots: set[Path] = set()
        self._outboxes: dict[Path, _Outbox] = {}
        self._channels: dict[tuple[tuple[str, ...], tuple[str, ...]], DaemonChannel] = {}
        # How to reach each daemon: the settings of the senders whose children write the outboxes (a child's
        # outbox names its daemon's address; its token and TLS files are its writer's, carried here).
        self._settings: dict[str, ChannelSettings] = {}
        self._latest: ChannelSettings | None = None
        self._lock = threading.Lock()
        # One delivery round at a time: the courier's thread, or a writer's `close()` settling its children.
        self._round_lock = threading.Lock()
        self._delivered: dict[str, int] = {}  # run → the children's events the daemon acknowledged
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def watch(self, options: ClientOptions) -> None:
        """Deliver the outboxes of this process's children under the options' spool root, with their token and
        TLS files (started on first call)."""
        with self._lock:
            self._roots.add(outbox_root(options.spool_root, os.getpid()))
            for address in options.addresses:
                self._settings[address] = options.channel
            self._latest = options.channel
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="summaryd-courier", daemon=True)
                self._thread.start()

    def drain(self, timeout: float) -> None:
        """At exit: deliver what the children left, within `timeout`, then stop."""
        if self._thread is None or self._pid != os.getpid():
            return
        deadline = time.monotonic() + timeout
        self._stop.set()
        self._wake.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        while self._locked_round() and time.monotonic() < deadline:
            time.sleep(min(_POLL, max(0.0, deadline - time.monotonic())))
        for path in list(self._outboxes):
            log.warning("summaryd: a child's outbox was not delivered; run: summaryd replay %s", path)
        self._remove_empty_roots()
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def settle(self, belongs: Callable[[str], bool], timeout: float) -> DeliveryReport:
        """Deliver now, within `timeout`, the outboxes of the runs `belongs` accepts that their children have let
        go; what the children of those runs got delivered so far (by this call or earlier rounds), and what is
        left in their outboxes. Nothing to do (no child ever wrote an outbox) returns at once."""
        if self._thread is None or self._pid != os.getpid():
            return DeliveryReport(delivered=0, undelivered=0, synced=True)
        deadline = time.monotonic() + timeout
        # Until a round of this call has looked: what the courier knows of (its thread may hold the round).
        pending = [o for o in list(self._outboxes.values()) if belongs(str(o.manifest["run"]))]
        finished: list[_Outbox] = []
        # The courier's own round may be in a call to an absent daemon: wait for it no longer than the deadline.
        while self._round_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            try:
                self._round(final=False, timeout=max(0.05, min(_TIMEOUT, deadline - time.monotonic())))
                pending = [o for o in self._outboxes.values() if belongs(str(o.manifest["run"]))]
                finished = [o for o in pending if not _held(o.path)]
            finally:
                self._round_lock.release()
            if not finished or time.monotonic() >= deadline:
                break
            time.sleep(min(_POLL / 4, max(0.0, deadline - time.monotonic())))
        if not self._outboxes:
            self._remove_empty_roots()
        running = len(pending) - len(finished)
        if running:
            log.info("summaryd: %d forked children still log to this writer; the courier delivers them", running)
        with self._lock:
            delivered = sum(n for run, n in self._delivered.items() if belongs(run))
        undelivered = sum(max(0, o.seen - 1 - o.acked) for o in pending)
        if undelivered:
            log.warning(
                "summaryd: %d events forked children logged were not delivered yet; this process delivers them "
                "at its exit, else `summaryd replay %s` does",
                undelivered,
                pending[0].path.parent,
            )
        # The courier closed each delivered outbox's session, which has the daemon fsync its file.
        return DeliveryReport(delivered=delivered, undelivered=undelivered, synced=not pending)

    def _remove_empty_roots(self) -> None:
        with self._lock:
            roots = list(self._roots)
        for root in roots:
            with contextlib.suppress(OSError):  # not empty (a child is writing, or an outbox is kept), or gone
                root.rmdir()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._round_lock:
                    self._round(final=False)
            except Exception:  # a bug here must not go unnoticed, nor stop the courier
                log.exception("summaryd courier failed a round")
            self._wake.wait(_POLL)
            self._wake.clear()

    def _locked_round(self) -> bool:
        with self._round_lock:
            return self._round(final=True)

    def _round(self, *, final: bool, timeout: float = _TIMEOUT) -> bool:
        """Deliver every outbox once; True while some remain."""
        with self._lock:
            roots = list(self._roots)
        for root in roots:
            with contextlib.suppress(FileNotFoundError):
                for path in sorted(root.iterdir()):
                    if path not in self._outboxes and (path / MANIFEST).is_file():
                        self._outboxes[path] = self._load(path)
        for path, outbox in list(self._outboxes.items()):
            try:
                if self._deliver(outbox, timeout):
                    del self._outboxes[path]
            except (grpc.RpcError, RedirectRefusedError, OSError, ValueError) as exc:
                outbox.opened = False  # resume again next round
                if final:
                    log.debug("summaryd courier: %s: %s", path, exc)
        return bool(self._outboxes)

    @staticmethod
    def _load(path: Path) -> _Outbox:
        manifest: dict[str, Any] = json.loads((path / MANIFEST).read_text())
        return _Outbox(path, manifest, next_sequence=int(manifest["first_sequence"]))

    def _daemons(self, manifest: dict[str, Any]) -> DaemonChannel:
        """The channel to the daemons an outbox records, following redirects to those and its allow-list only."""
        key = recorded_daemons(manifest)
        daemons = self._channels.get(key)
        if daemons is None:
            with self._lock:
                # An address no watched sender has (a writer made in the child): the latest settings watched.
                settings = self._settings.get(key[0][0], self._latest) or ChannelSettings()
            daemons = self._channels[key] = DaemonChannel(key[0], settings, key[1])
        return daemons

    def _deliver(self, outbox: _Outbox, timeout: float = _TIMEOUT) -> bool:
        """Send what the child has appended; True when the outbox is complete, delivered and deleted."""
        try:
            lock_fd: int | None = lock(outbox.path)
        except SpoolLockedError:
            lock_fd = None  # the child is still writing to it
        try:
            finished = lock_fd is not None
            events = self._read_new(outbox)
            if not events and not finished:
                return False
            daemons = self._daemons(outbox.manifest)
            stub = daemons.stub
            session_id = str(outbox.manifest["session_id"])
            first = outbox.next_sequence - len(events)
            if not outbox.opened:
                resume_at = max(outbox.acked + 1, int(outbox.manifest["first_sequence"]))
                request = open_request(outbox.manifest, resume_at, "summaryd-courier")
                answer = stub.OpenSession(request, timeout=timeout)
                outbox.acked, outbox.limits = answer.last_sequence, DaemonLimits.of(answer)
                outbox.opened = True
            new = [e for i, e in enumerate(events) if first + i > outbox.acked]
            if new:
                start = outbox.next_sequence - len(new)
                acked = max(outbox.acked, send_events(stub, session_id, start, new, timeout, outbox.limits))
                run = str(outbox.manifest["run"])
                with self._lock:
                    self._delivered[run] = self._delivered.get(run, 0) + acked - max(outbox.acked, start - 1)
                outbox.acked = acked
            if not finished:
                return False
            stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), timeout=timeout)
            outbox.manifest["delivered_through"] = outbox.next_sequence - 1
            write_manifest(outbox.path, outbox.manifest)
            shutil.rmtree(outbox.path, ignore_errors=True)
            return True
        except grpc.RpcError as exc:
            # What was read but not acknowledged is read again next round, from the daemon the failure names (the
            # run's owner, if it is one the outbox records) or the next one when this one is away.
            self._rewind(outbox)
            self._daemons(outbox.manifest).failed(exc)
            raise
        except BaseException:
            self._rewind(outbox)
            raise
        finally:
            if lock_fd is not None:
                os.close(lock_fd)

    @staticmethod
    def _read_new(outbox: _Outbox) -> list[bytes]:
        with open(outbox.path / outbox.manifest["file"], "rb") as f:
            f.seek(outbox.offset)
            records, consumed = read_records(f.read())
        if outbox.offset == 0 and records:
            records = records[1:]  # the file_version record carries no sequence number
        outbox.offset += consumed
        outbox.next_sequence += len(records)
        outbox.seen = max(outbox.seen, outbox.next_sequence)
        return records

    @staticmethod
    def _rewind(outbox: _Outbox) -> None:
        outbox.offset = 0
        outbox.next_sequence = int(outbox.manifest["first_sequence"])


def _held(path: Path) -> bool:
    """Whether a live child still holds its outbox's lock (it may append more)."""
    try:
        fd = lock(path)
    except SpoolLockedError:
        return True
    except OSError:
        return False  # gone: delivered and deleted
    os.close(fd)
    return False


courier = Courier()
"""This process's courier (a forked child makes its own)."""


def _after_fork_in_child() -> None:
    global courier
    courier = Courier()
    _fork.deliver_children_with(courier)


_fork.deliver_children_with(courier)
os.register_at_fork(after_in_child=_after_fork_in_child)
