"""The courier: delivers the outboxes of forked child processes through this process's gRPC.

gRPC does not survive `fork()` in a process whose threads are inside gRPC calls (a sender's ack thread always
is): a child that opens a channel of its own may stall for seconds or fail with "Closed on fork". So a child
forked from a process where the client used gRPC never touches gRPC (`_process.forked_from`): its senders
append their numbered events to an *outbox*, a spool (`_spool`) under `<spool root>/children-of-<pid>/`, and
the courier thread of that ancestor process delivers it, resuming the child's own session with the child's
sequence numbers (so exactly once, like `summaryd replay`):

- while the child lives (it holds the outbox's lock) the courier sends what it has appended so far;
- once it has let go (closed its writer, or exited), the courier sends the rest, closes the session, and
  deletes the outbox.

An outbox the courier could not deliver (the daemon was away until this process ended) stays on disk for
`summaryd replay`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from summaryd.client._batch_fit import DaemonLimits
from summaryd.client._channel import ChannelSettings, open_channel
from summaryd.client._options import ClientOptions
from summaryd.client._replay import open_request, send_events
from summaryd.client._spool import MANIFEST, SpoolLockedError, lock, write_manifest
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import read_records

log = logging.getLogger("summaryd.client")

_POLL = 0.2
_TIMEOUT = 10.0


def outbox_root(spool_root: Path, pid: int) -> Path:
    """Where the children of process `pid` put their outboxes."""
    return spool_root / f"children-of-{pid}"


@dataclass
class _Outbox:
    """Delivery state of one child session's outbox."""

    path: Path
    manifest: dict[str, Any]
    offset: int = 0  # bytes of the outbox file read so far (whole records only)
    next_sequence: int = 0  # sequence number of the next record read
    acked: int = 0
    opened: bool = False
    limits: DaemonLimits = field(default_factory=DaemonLimits)  # what the daemon stated when the session opened


class Courier:
    """One per process; its thread starts after the first fork and polls the outbox roots."""

    def __init__(self) -> None:
        self._roots: set[Path] = set()
        self._outboxes: dict[Path, _Outbox] = {}
        self._channels: dict[str, grpc.Channel] = {}
        # How to reach each daemon: the settings of the senders whose children write the outboxes (a child's
        # outbox names its daemon's address; its token and TLS files are its writer's, carried here).
        self._settings: dict[str, ChannelSettings] = {}
        self._latest: ChannelSettings | None = None
        self._lock = threading.Lock()
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
        while self._round(final=True) and time.monotonic() < deadline:
            time.sleep(min(_POLL, max(0.0, deadline - time.monotonic())))
        for path in list(self._outboxes):
            log.warning("summaryd: a child's outbox was not delivered; run: summaryd replay %s", path)
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._round(final=False)
            except Exception:  # a bug here must not go unnoticed, nor stop the courier
                log.exception("summaryd courier failed a round")
            self._wake.wait(_POLL)
            self._wake.clear()

    def _round(self, *, final: bool) -> bool:
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
                if self._deliver(outbox):
                    del self._outboxes[path]
            except (grpc.RpcError, OSError, ValueError) as exc:
                outbox.opened = False  # resume again next round
                if final:
                    log.debug("summaryd courier: %s: %s", path, exc)
        return bool(self._outboxes)

    @staticmethod
    def _load(path: Path) -> _Outbox:
        manifest: dict[str, Any] = json.loads((path / MANIFEST).read_text())
        return _Outbox(path, manifest, next_sequence=int(manifest["first_sequence"]))

    def _stub(self, address: str) -> pb_grpc.SummariesStub:
        channel = self._channels.get(address)
        if channel is None:
            with self._lock:
                # An address no watched sender has (a writer made in the child): the latest settings watched.
                settings = self._settings.get(address, self._latest) or ChannelSettings()
            channel = self._channels[address] = open_channel(address, settings)
        return pb_grpc.SummariesStub(channel)

    def _deliver(self, outbox: _Outbox) -> bool:
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
            stub = self._stub(str(outbox.manifest["address"]))
            session_id = str(outbox.manifest["session_id"])
            first = outbox.next_sequence - len(events)
            if not outbox.opened:
                resume_at = max(outbox.acked + 1, int(outbox.manifest["first_sequence"]))
                request = open_request(outbox.manifest, resume_at, "summaryd-courier")
                answer = stub.OpenSession(request, timeout=_TIMEOUT)
                outbox.acked, outbox.limits = answer.last_sequence, DaemonLimits.of(answer)
                outbox.opened = True
            new = [e for i, e in enumerate(events) if first + i > outbox.acked]
            if new:
                start = outbox.next_sequence - len(new)
                outbox.acked = max(outbox.acked, send_events(stub, session_id, start, new, _TIMEOUT, outbox.limits))
            if not finished:
                return False
            stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), timeout=_TIMEOUT)
            outbox.manifest["delivered_through"] = outbox.next_sequence - 1
            write_manifest(outbox.path, outbox.manifest)
            shutil.rmtree(outbox.path, ignore_errors=True)
            return True
        except BaseException:
            # What was read but not acknowledged is read again next round.
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
        return records

    @staticmethod
    def _rewind(outbox: _Outbox) -> None:
        outbox.offset = 0
        outbox.next_sequence = int(outbox.manifest["first_sequence"])
