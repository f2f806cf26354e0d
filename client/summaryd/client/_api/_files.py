"""Files beside a run's event files (the embedding projector's), uploaded with `PutFile` in the background.

`FileUploader` owns one daemon thread, started on first use, that takes jobs from a bounded queue, encodes
them (a job returns `(path, content)` pairs; the caller handed it copies of its data) and sends each file with
its own deadline and a few retries with backoff. A file the daemon could not take for now (it is away) is kept
and tried again before the next job and every few seconds meanwhile; what is still not delivered at `close()`
goes to the session's files spool (see `_spool`), which `summaryd replay` uploads. It never raises into the
caller: a job it could not queue or encode, a file the daemon refused, or one it could not spool is counted in
`failed`, which the writer reports as `dropped["files"]`. The files go to the session of the run's `Sender`,
which must be open first: the uploader starts that sender and waits for its session before the first upload,
and tries again when the daemon does not know the session (yet).

`embedding_files` builds the projector's files exactly as torch's `add_embedding` writes them: with torch's
own helpers (`torch.utils.tensorboard._embedding`) when the process imported `torch.utils.tensorboard`, else
with numpy and Pillow (torch's helpers import TensorFlow when it is installed).
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import numpy as np

from summaryd.client._api import _summaries, _torch
from summaryd.client._channel import open_channel
from summaryd.client._sender import Sender
from summaryd.client._spool import SpoolLockedError, spool_files
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

log = logging.getLogger("summaryd.client")

Files = list[tuple[str, bytes]]
Job = Callable[[], Files]

_RETRY = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)
_STOP: Any = object()


def _no_job() -> Files:
    return []


class FileUploader:
    """Uploads files to the session of `sender` from a background thread.

    Args:
        sender: the run's sender; its session receives the files.
        max_jobs: bound of the queue; a job beyond it is dropped (counted in `failed`).
        rpc_timeout: deadline of each `PutFile`, and of waiting for the session to open.
        attempts: tries per file before it is given up.
        backoff_secs: first and longest pause between tries.
    """

    def __init__(
        self,
        sender: Sender,
        *,
        max_jobs: int = 64,
        rpc_timeout: float | None = None,
        attempts: int = 4,
        backoff_secs: tuple[float, float] = (0.1, 2.0),
    ) -> None:
        self.sender = sender
        self.options = sender.options  # the writer's settings: its daemon, token, TLS files and spool
        self.rpc_timeout = self.options.rpc_timeout if rpc_timeout is None else rpc_timeout
        self.attempts = attempts
        self.backoff_secs = backoff_secs
        self.failed = 0
        self.spooled = 0
        self.spool_path: str | None = None
        self.last_error: str | None = None
        # Files the daemon could not take yet, by path (a later version of a path replaces the earlier).
        self._undelivered: dict[str, bytes] = {}
        self._unrun: Job | None = None
        self._queue: queue.Queue[Any] = queue.Queue(max_jobs)
        self._cond = threading.Condition()
        self._pending = 0
        self._thread: threading.Thread | None = None
        self._channel: grpc.Channel | None = None
        self._channel_address = ""
        self._stop = threading.Event()

    def submit(self, job: Job) -> bool:
        """Queue a job (never blocks); False when it was dropped (queue full, or closed)."""
        with self._cond:
            if self._stop.is_set():
                self.failed += 1
                return False
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"summaryd-files[{self.sender.run}]", daemon=True
                )
                self._thread.start()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            log.warning(
                "summaryd: the file upload queue of run %r is full; a projector upload was dropped", self.sender.run
            )
            self._done(failed=True)
            return False
        return True

    def wait(self, timeout: float | None) -> bool:
        """Wait until every queued job is uploaded or given up (at most `timeout`); True when none is left."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def close(self, timeout: float | None) -> int:
        """Wait for the uploads (at most `timeout`), stop the thread, and spool what is left (jobs not run yet
        are encoded here); what could be neither delivered nor spooled counts as failed. Files kept while the
        daemon was away are tried once more first when it answers again: the idle retry may not have reached
        them (or may be half way through them), and stopping it would spool files the daemon could take."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.wait(timeout)
        with self._cond:
            kept_any = bool(self._undelivered) and not self._stop.is_set()
        if kept_any and not self.sender.unreachable and self.submit(_no_job):
            # A job with no files: the thread retries the kept files before it, so waiting for it waits for them.
            self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        with self._cond:
            self._stop.set()
            self._cond.notify_all()
            thread = self._thread
        lost = 0
        if thread is not None:
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(_STOP)
            thread.join(1.0)
            lost = int(thread.is_alive())  # stuck in a call: the job it runs is lost with it
        # Jobs not run yet, oldest first: the one taken off the queue as the thread stopped, then the queue's.
        unrun = [] if self._unrun is None else [self._unrun]
        with contextlib.suppress(queue.Empty):
            while True:
                unrun.append(self._queue.get_nowait())
        left: Files = []
        for job in unrun:
            if job is not _STOP:
                files = self._encode(job)
                left += files or []
                lost += files is None
        with self._cond:
            self._pending = 0
            kept = dict(self._undelivered)
            self._undelivered.clear()
        kept.update(left)  # later versions of a path (the projector's config) replace earlier ones
        self.failed += lost
        if kept:
            self._spool(list(kept.items()))
        return self.failed

    def _spool(self, files: Files) -> None:
        sender = self.sender
        if not self.options.spool_enabled:
            self.failed += len(files)
            log.warning(
                "summaryd: %d projector files of run %r were not uploaded (spooling is off)", len(files), sender.run
            )
            return
        try:
            directory = spool_files(self.options.spool_root, sender.identity, files)
        except (OSError, ValueError, SpoolLockedError) as exc:
            self.failed += len(files)
            log.error("summaryd: %d projector files of run %r could not be spooled: %s", len(files), sender.run, exc)
            return
        self.spooled += len(files)
        self.spool_path = str(directory)
        log.warning(
            "summaryd: %d projector files of run %r were not uploaded; they are in %s (see `summaryd replay`)",
            len(files),
            sender.run,
            directory,
        )

    def _done(self, *, failed: bool) -> None:
        with self._cond:
            if self._stop.is_set():
                return  # close() counted every job still pending
            if failed:
                self.failed += 1
            self._pending = max(0, self._pending - 1)
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            while True:
                try:
                    # While files wait for the daemon, wake up now and then to try them again.
                    job = self._queue.get(timeout=self.backoff_secs[1] if self._undelivered else None)
                except queue.Empty:
                    self._retry_undelivered()
                    continue
                if job is _STOP or self._stop.is_set():
                    if job is not _STOP:
                        self._unrun = job  # close() spools it, before the jobs still queued
                    return
                self._retry_undelivered()
                files = self._encode(job)
                ok = files is not None and all(self._deliver(path, content) for path, content in files)
                self._done(failed=not ok)
        finally:
            if self._channel is not None:
                self._channel.close()
                self._channel = None

    def _encode(self, job: Job) -> Files | None:
        try:
            return job()
        except Exception as exc:  # an encoding error must not reach the caller, nor end the thread
            log.warning("summaryd: projector files for run %r could not be encoded: %r", self.sender.run, exc)
            self.last_error = repr(exc)
            return None

    def _deliver(self, path: str, content: bytes) -> bool:
        """Upload one file, or keep it for later when the daemon cannot take it now (True either way); False
        when the daemon refused it."""
        delivered = self._put(path, content)
        if delivered is None:
            with self._cond:
                self._undelivered[path] = content
            return True
        with self._cond:
            self._undelivered.pop(path, None)  # an older version of it, now replaced
        return delivered

    def _retry_undelivered(self) -> None:
        with self._cond:
            waiting = list(self._undelivered.items())
        for path, content in waiting:
            if self._stop.is_set() or self._put(path, content) is None:
                return
            with self._cond:
                if self._undelivered.get(path) is content:
                    del self._undelivered[path]

    def _session_open(self) -> bool:
        """Start the run's sender if need be and wait (at most `rpc_timeout`) until its session is open."""
        sender = self.sender
        if sender.run_dir is not None:
            return True
        sender.start()
        deadline = time.monotonic() + self.rpc_timeout
        while sender.run_dir is None and time.monotonic() < deadline and not sender.unreachable:
            if self._stop.wait(0.01):
                return False
        return sender.run_dir is not None

    def _put(self, path: str, content: bytes) -> bool | None:
        """Upload one file: True when the daemon took it, False when it refused it, None when it could not be
        reached (or the uploader is stopping)."""
        sender = self.sender
        backoff = self.backoff_secs[0]
        for attempt in range(self.attempts):
            if attempt:
                if self._stop.wait(backoff):
                    return None
                backoff = min(backoff * 2, self.backoff_secs[1])
            if not self._session_open():
                self.last_error = f"the session of run {sender.run!r} did not open"
                if sender.unreachable:
                    break  # the daemon is away: keep the file, try again when idle
                continue
            # The daemon that holds the session: the sender's of the moment (it may have failed over, or followed
            # a redirect to the run's owner), never one it was not given.
            if self._channel is not None and self._channel_address != sender.address:
                self._channel.close()
                self._channel = None
            if self._channel is None:
                self._channel_address = sender.address
                self._channel = open_channel(self._channel_address, self.options.channel)
            request = pb.PutFileRequest(session_id=sender.session_id, path=path, content=content)
            try:
                pb_grpc.SummariesStub(self._channel).PutFile(request, timeout=self.rpc_timeout)
                return True
            except grpc.RpcError as exc:
                code = exc.code()
                self.last_error = f"{code.name}: {exc.details()}"
                if code not in _RETRY:
                    log.warning("summaryd: %r of run %r was refused (%s)", path, sender.run, self.last_error)
                    return False
        log.info("summaryd: %r of run %r is kept to be uploaded later (%s)", path, sender.run, self.last_error)
        return None


# ---- the embedding projector's files (torch's add_embedding) ---------------------------------------------------


def encode_tag(tag: str) -> str:
    """torch's `SummaryWriter._encode`: the tag as one path component."""
    return tag.replace("%", "%25").replace("/", "%2f").replace("\\", "%5c")


def embedding_files(
    subdir: str, mat: np.ndarray[Any, Any], metadata: Sequence[Any] | None, label_img: Any, header: Sequence[str] | None
) -> Files:
    """The files of one `add_embedding` call, under `subdir`, byte for byte as torch writes them."""
    # torch's helpers write with TensorFlow's file API when it is installed: only when the process imported
    # torch's tensorboard package, and TensorFlow with it, already (`_torch`); ours give the same bytes.
    if _torch.builders() is not None and _torch.tensorboard_imported():
        files = _torch_embedding_files(mat, metadata, label_img, header)
    else:
        files = []
        if metadata is not None:
            files.append(("metadata.tsv", _metadata_tsv(metadata, header)))
        if label_img is not None:
            files.append(("sprite.png", _sprite_png(label_img)))
        files.append(("tensors.tsv", _tensors_tsv(mat)))
    return [(f"{subdir}/{name}", content) for name, content in files]


def _torch_embedding_files(
    mat: np.ndarray[Any, Any], metadata: Sequence[Any] | None, label_img: Any, header: Sequence[str] | None
) -> Files:
    import torch
    from torch.utils.tensorboard import _embedding

    with tempfile.TemporaryDirectory(prefix="summaryd-embedding-") as folder:
        names = []
        if metadata is not None:
            _embedding.make_tsv(list(metadata), folder, metadata_header=header)
            names.append("metadata.tsv")
        if label_img is not None:
            _embedding.make_sprite(torch.from_numpy(label_img), folder)
            names.append("sprite.png")
        _embedding.make_mat(mat, folder)
        names.append("tensors.tsv")
        files = []
        for name in names:
            with open(os.path.join(folder, name), "rb") as file:
                files.append((name, file.read()))
        return files


def _metadata_tsv(metadata: Sequence[Any], header: Sequence[str] | None) -> bytes:
    if not header:
        lines = [str(x) for x in metadata]
    else:
        lines = ["\t".join(str(e) for e in row) for row in [header, *metadata]]
    return ("\n".join(lines) + "\n").encode()


def _tensors_tsv(mat: np.ndarray[Any, Any]) -> bytes:
    return b"".join(("\t".join(str(i.item()) for i in row) + "\n").encode() for row in mat)


def _sprite_png(label_img: np.ndarray[Any, Any]) -> bytes:
    from PIL import Image

    columns = math.ceil(label_img.shape[0] ** 0.5)
    chw = _summaries.grid(label_img, columns)
    square = np.zeros((chw.shape[2], chw.shape[2], 3))
    hwc = chw.transpose(1, 2, 0)
    square[: hwc.shape[0], :, :] = hwc
    picture = Image.fromarray(np.uint8((square * 255).clip(0, 255)))
    with io.BytesIO() as buffer:
        picture.save(buffer, format="PNG")
        return buffer.getvalue()
