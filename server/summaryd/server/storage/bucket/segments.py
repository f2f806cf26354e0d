"""Sealed segments: a run's staged event file goes to the bucket as immutable objects, each byte once.

With a bucket logdir the run writer writes its event files into the staging directory as it does on a local
disk (with journal, recovery and exactly-once unchanged). The `SegmentShipper` follows each staged file and
uploads the bytes the writer has journaled since the last upload as one object, a *segment*, when they are
old enough (`SealPolicy`) or many enough, and the rest when the file closes. Object stores cannot append;
re-uploading a growing file (what TensorFlow's and tensorboardX's S3 writers do on every flush) costs the
square of its size, segments cost its size.

A segment's key is the staged file's name and the offset of its first byte:

    PREFIX/RUN/events.out.tfevents.<stamp>.<host>.<pid>.<n>.<offset, 16 digits>

Keys sort in the order of the bytes (the file names sort in the order they were made, `event_file.next_name`,
and the zero-padded offsets within one file), which is the order TensorBoard's loaders walk a directory: they
read the files whose name contains `tfevents` in name order and never return to an earlier one. Only the
first segment of a file starts with `file_version`; a later one holds whole records that carry on where the
previous one stopped, which both TensorBoard loaders (the directory watcher and the directory loader) read as
more of the same run. The uploads of one run go one at a time, in key order: a later segment visible before an
earlier one would make TensorBoard skip the earlier one for good.

The bucket is the record of what was uploaded: a file's uploaded end is the largest offset + size among its
segments, so a daemon killed between upload and anything else uploads neither a byte twice nor a byte too few
when it starts again (`recover`), before it serves. A fully uploaded, closed file is truncated to an empty
*stub* in staging: its name keeps the next file's name sorting after it. While a file is open, the disk blocks
of its uploaded bytes are given back (a hole punched, Linux), so staging holds about the pending bytes only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter

from summaryd.server.settings import option
from summaryd.server.storage.bucket import segment_sessions
from summaryd.server.storage.bucket.store import Bucket, BucketError, PreconditionFailedError

log = logging.getLogger("summaryd.server.segments")  # the name log lines carry, kept across moves

OFFSET_DIGITS = 16
AGE_FRACTION = 16
"""A segment may wait up to 1/AGE_FRACTION of its file's age (within `seal_secs`..`seal_max_secs`)."""
_RETRY_SECS = (1.0, 2.0, 5.0, 10.0, 30.0)
_FENCE_ROUNDS = 100


class Fencing(Protocol):
    """What the shipper asks the run leases (`run_ownership.RunOwnership`) before it uploads anything."""

    async def admit(self, run_dir: str, name: str) -> bool:
        """Whether a segment of staged file `name` of `run_dir` may be uploaded now (the lease held, live by
        the monotonic clock, and naming the file)."""
        ...

    def holds(self, run_dir: str) -> bool:
        """Whether this daemon holds the lease that covers `run_dir`."""
        ...

    def fenced(self, run_dir: str) -> None:
        """A segment of `run_dir` found its key taken by another daemon's fence: the lease is lost."""
        ...

    async def reclaim(self, run_dir: str) -> str | None:
        """Take the lease covering `run_dir` for recovery if no other daemon held it since this one; the leased
        run, or None when another daemon did (its staged leftovers are not this daemon's to upload)."""
        ...

    async def unclaim(self, leased: str) -> None:
        """Recovery of the run `leased` (from `reclaim`) is done."""
        ...


class UploadObserver(Protocol):
    """Told after every upload, on the event loop (`backend.DurableWatermarks`)."""

    def uploaded(self, run_dir: str, name: str, end: int) -> None:
        """The staged file `name` of `run_dir` is in the bucket up to byte `end`."""
        ...


def _exit_after_uploads() -> int:
    """Tests only: `SUMMARYD_TEST_EXIT_AFTER_UPLOADS=N` makes the daemon exit at once after its N-th upload,
    before anything else hears of it (the instant a lost daemon leaves segments its session state does not
    count yet, which no timing can hit). Read once, at start-up; unset or not a number: never."""
    value = os.environ.get("SUMMARYD_TEST_EXIT_AFTER_UPLOADS", "")
    return int(value) if value.isdigit() else 0


_EXIT_AFTER_UPLOADS = _exit_after_uploads()


def segment_key(run_dir: str, file_name: str, offset: int) -> str:
    """The key of the segment of `run_dir`'s staged file `file_name` that starts at byte `offset`."""
    return f"{run_dir}/{file_name}.{offset:0{OFFSET_DIGITS}d}"


def parse_segment(key: str) -> tuple[str, str, int] | None:
    """`(run_dir, file_name, offset)` of a segment key; None for any other object."""
    run_dir, _, base = key.rpartition("/")
    name, _, offset = base.rpartition(".")
    if not run_dir or "tfevents" not in name or len(offset) != OFFSET_DIGITS or not offset.isdigit():
        return None
    return run_dir, name, int(offset)


@dataclass(frozen=True)
class SealPolicy:
    """When a staged file's pending bytes become a segment.

    By size at once (`seal_bytes`), by age after a while that grows with the file: `seal_secs` while the
    file is young, then 1/AGE_FRACTION of its age, never more than `seal_max_secs`. A run's object count thus
    grows with the logarithm of its age for its first hour or so, then by one per `seal_max_secs` at most
    (about 290 a day at the default 300 s), however often it writes.
    """

    seal_secs: float = option(
        5.0,
        "with a bucket --logdir: seconds new events wait before they are uploaded as a segment (while the run is "
        "young; then longer as it ages, up to --seal-max-secs)",
        "SECS",
    )
    seal_max_secs: float = option(
        300.0, "with a bucket --logdir: the longest new events of an old run wait before they are uploaded", "SECS"
    )
    seal_bytes: int = option(
        16 * 1024 * 1024,
        "with a bucket --logdir: a run's segment is uploaded at once when it reaches this size",
        "BYTES",
    )

    def __post_init__(self) -> None:
        if self.seal_secs <= 0 or self.seal_max_secs <= 0 or self.seal_bytes <= 0:
            raise ValueError("--seal-secs, --seal-max-secs and --seal-bytes must be positive")

    def interval(self, file_age: float) -> float:
        """The longest a pending byte waits in a file that has been written for `file_age` seconds."""
        return min(max(self.seal_secs, file_age / AGE_FRACTION), max(self.seal_max_secs, self.seal_secs))

    def due(self, pending: int, pending_age: float, file_age: float) -> bool:
        """Whether `pending` bytes, the oldest `pending_age` seconds old, are to be sealed now."""
        return pending > 0 and (pending >= self.seal_bytes or pending_age >= self.interval(file_age))


@dataclass(eq=False)
class StagedFile:
    """One event file in staging: how much of it is journaled (`size`) and uploaded."""

    run_dir: str
    name: str
    started: float
    size: int = 0
    uploaded: int = 0
    pending_since: float | None = None
    closed: bool = False
    segments: int = 0
    last_upload: float | None = None
    wanted: int = 0
    """Bytes a caller waits to see uploaded (`upload_through`): due now, whatever their age."""
    forsaken: bool = False
    """Its run's lease is lost: the pending bytes are never uploaded from here (the clients resend them)."""
    boundaries: list[tuple[int, str, int]] = field(default_factory=list)
    """Where each batch journaled since the last upload ends (a segment ends at one of these), with its
    session and last sequence number ("" and 0 when not told)."""
    attempt: tuple[int, int, dict[str, int]] | None = None
    """(start, end, sessions named) of a segment put whose outcome is unknown (cut off, or failed): it may have
    landed, so the next try puts the very same bytes, which the store then shows as done."""

    @property
    def pending(self) -> int:
        return self.size - self.uploaded


@dataclass
class UploadCounters:
    """What went to the bucket (also exported as Prometheus counters when given a registry)."""

    objects: int = 0
    bytes: int = 0
    failures: int = 0
    _objects: Counter | None = field(default=None, repr=False)
    _bytes: Counter | None = field(default=None, repr=False)

    @classmethod
    def registered(cls, registry: CollectorRegistry | None) -> UploadCounters:
        if registry is None:
            return cls()
        return cls(
            _objects=Counter("summaryd_segments_uploaded", "Event-file segments uploaded.", registry=registry),
            _bytes=Counter(
                "summaryd_segment_bytes_uploaded", "Bytes of event-file segments uploaded.", registry=registry
            ),
        )

    def count(self, size: int) -> None:
        self.objects += 1
        self.bytes += size
        if self._objects is not None and self._bytes is not None:
            self._objects.inc()
            self._bytes.inc(size)


class SegmentShipper:
    """Uploads staged event files as sealed segments; the run writer tells it what it journaled and closed.

    `appended` and `closed` are called on the event loop (they only note sizes); uploads run in a task of their
    own (`start`), one run's segments in order, different runs side by side. `drain` seals everything at
    shutdown; what it cannot upload stays staged for `recover` at the next start.
    """

    def __init__(
        self,
        bucket: Bucket,
        staging_dir: str,
        policy: SealPolicy,
        executor: Executor,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        fence: Fencing | None = None,
        observer: UploadObserver | None = None,
    ) -> None:
        """`fence` (the run leases; a bucket logdir's daemon always has them) is asked before every upload,
        `observer` told after each."""
        self.bucket = bucket
        self.staging_dir = staging_dir
        self.policy = policy
        self.counters = UploadCounters.registered(registry)
        self._executor = executor
        self._clock = clock
        self._files: dict[tuple[str, str], StagedFile] = {}
        self._wake = asyncio.Event()
        self._shipping = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        self._last_uploads: dict[str, float] = {}  # by run, wall clock: outlives the run's uploaded files
        self._progress = asyncio.Event()  # set (and replaced) after every upload, for `upload_through`
        self._forsaken: set[tuple[str, str]] = set()  # (run, name) of files whose lease was lost (small, kept)
        self._fence = fence
        self._observer = observer

    # The writer's side.

    def appended(self, run_dir: str, name: str, size: int, batch: tuple[str, int] | None = None) -> None:
        """The staged file `name` of `run_dir` now holds `size` journaled bytes (whole records), the last of
        them a `batch` of (session id, last sequence number)."""
        now = self._clock()
        staged = self._files.get((run_dir, name))
        if staged is None and (run_dir, name) in self._forsaken:  # its lease was lost: never uploaded from here
            return
        if staged is None:
            staged = self._files[(run_dir, name)] = StagedFile(run_dir, name, started=now)
        if size > staged.size:
            staged.boundaries.append((size, *(batch or ("", 0))))
        staged.size = size
        if staged.pending_since is None and staged.pending > 0:
            staged.pending_since = now
        if staged.pending >= self.policy.seal_bytes:
            self._wake.set()

    def closed(self, run_dir: str, name: str, size: int) -> None:
        """The writer closed the staged file at `size` bytes: its last segment is sealed now."""
        self.appended(run_dir, name, size)
        if (staged := self._files.get((run_dir, name))) is not None:
            staged.closed = True
        self._wake.set()

    async def file_written(self, run_dir: str, path: str, content: bytes) -> None:
        """Upload a file written beside the run's event files (the projector's) whole, replacing the last.

        Raises:
            OSError: the bucket refused it (EIO; the daemon answers UNAVAILABLE and the client tries again).
        """
        try:
            await self.bucket.put(f"{run_dir}/{path}", content)
        except BucketError as exc:
            raise OSError(errno.EIO, str(exc)) from exc
        self.counters.count(len(content))

    async def upload_through(self, run_dir: str, name: str, size: int) -> None:
        """Return once the first `size` bytes of staged file `name` are in the bucket (sealed now, not when due;
        the run's earlier files go first). Waits while the bucket fails: callers bound it with their deadline."""
        key = (run_dir, name)
        staged = self._files.get(key)
        if staged is None and key not in self._forsaken:  # wholly uploaded and put away already
            return
        # Never beyond what the writer reported: bytes of a batch still being written (or cut) are not waited on.
        size = min(size, staged.size) if staged is not None else size
        if staged is not None:
            staged.wanted = max(staged.wanted, size)
        self._wake.set()
        while (current := self._files.get(key)) is not None and current.uploaded < size and not current.forsaken:
            await self._progress.wait()
        if key in self._forsaken:
            raise OSError(errno.EIO, f"run {run_dir}: this daemon no longer holds the run's lease")

    # Status.

    def staged(self) -> list[StagedFile]:
        """The files in staging that are open or not yet wholly uploaded."""
        return list(self._files.values())

    def backlog(self, run_dir: str) -> tuple[int, float | None]:
        """The bytes of `run_dir` staged and not yet uploaded, and when its last segment was (wall clock)."""
        pending = sum(staged.pending for staged in self._files.values() if staged.run_dir == run_dir)
        return pending, self._last_uploads.get(run_dir)

    # Lifecycle.

    async def recover(self, sessions_of: Callable[[str], dict[str, int]] | None = None) -> int:
        """Upload what a stopped daemon left in staging (before serving); return the bytes uploaded.

        A run's leftovers go up only once this daemon holds its lease again, and only when no other daemon
        held it since (`Fencing.reclaim`): otherwise they were the other daemon's to write, their clients
        resent them there, and they are discarded (logged). The last segment of each run names the sessions
        `sessions_of(run_dir)` gives (its local records), so that a daemon resuming them from the bucket
        counts it (`segment_sessions`), as it counts any other segment.

        Raises:
            BucketError: the bucket cannot be listed or written; the daemon must not serve then, or the
                staged bytes would be overtaken by newer segments.
        """
        loop = asyncio.get_running_loop()
        leftovers = await loop.run_in_executor(self._executor, _staged_files, self.staging_dir)
        before = self.counters.bytes
        for run_dir, names in sorted(leftovers.items()):
            leased = run_dir if self._fence is None else await self._fence.reclaim(run_dir)
            if leased is None:
                await self._discard(run_dir, names)
                continue
            try:
                await self._recover_run(run_dir, names, sessions_of(run_dir) if sessions_of else {})
            finally:
                if self._fence is not None:
                    await self._fence.unclaim(leased)
        uploaded = self.counters.bytes - before
        if uploaded:
            log.warning("uploaded %d staged bytes a stopped daemon left behind", uploaded)
        return uploaded

    async def _recover_run(self, run_dir: str, names: list[tuple[str, int]], sessions: dict[str, int]) -> None:
        loop = asyncio.get_running_loop()
        ends = await self._uploaded_ends(run_dir)
        named = dict(sorted(sessions.items(), key=lambda item: -item[1])[: segment_sessions.MAX_SESSIONS])
        if len(sessions) > len(named):
            log.warning(
                "run %s: the staged leftovers hold %d sessions, more than a segment names (%d)",
                run_dir,
                len(sessions),
                len(named),
            )
        for index, (name, size) in enumerate(names):
            staged = StagedFile(run_dir, name, started=self._clock(), size=size, closed=True)
            staged.uploaded = ends.get(name, 0)
            if staged.uploaded > size:
                log.warning(
                    "run %s: %s has %d bytes in the bucket but %d in staging (staging lost its tail); keeping "
                    "the bucket's",
                    run_dir,
                    name,
                    staged.uploaded,
                    size,
                )
                staged.uploaded = size
            # Everything of the run staged here is in the bucket once its last file is: that segment names
            # every session of the run up to what this daemon holds of it.
            held = named if index == len(names) - 1 else {}
            while staged.pending and not staged.forsaken:
                if not await self._upload(staged, raise_errors=True, held=held) and not staged.forsaken:
                    raise BucketError(f"run {run_dir}: its lease does not admit uploading {name}")
            await loop.run_in_executor(self._executor, self._stub, staged)

    async def _discard(self, run_dir: str, names: list[tuple[str, int]]) -> None:
        loop = asyncio.get_running_loop()
        ends = await self._uploaded_ends(run_dir)
        pending = sum(max(size - ends.get(name, 0), 0) for name, size in names)
        for name, size in names:
            await loop.run_in_executor(self._executor, self._stub, StagedFile(run_dir, name, 0.0, size))
        log.warning(
            "run %s: another daemon has held its lease since this one staged %d bytes not uploaded; they are "
            "discarded, not uploaded (their clients sent them to that daemon)",
            run_dir,
            pending,
        )

    def start(self) -> None:
        """Start sealing and uploading in the background."""
        self._task = asyncio.create_task(self._run(), name="summaryd-segments")

    async def drain(self) -> None:
        """Seal and upload every pending byte (shutdown); stop the background task."""
        await self.stop()
        await self.ship(force=True)

    async def stop(self) -> None:
        """Stop the background task; what is staged and not uploaded stays for the next start-up."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        tick = max(min(self.policy.seal_secs / 4, 0.5), 0.02)
        while True:
            self._wake.clear()
            try:
                await self.ship()
            except Exception:
                log.exception("uploading segments failed")
            delay = tick if not self._failures else _RETRY_SECS[min(self._failures, len(_RETRY_SECS)) - 1]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)

    async def ship(self, force: bool = False) -> None:
        """Upload the segments that are due (all pending bytes with `force`), runs side by side."""
        async with self._shipping:
            runs: dict[str, list[StagedFile]] = {}
            for staged in sorted(self._files.values(), key=lambda s: s.name):
                runs.setdefault(staged.run_dir, []).append(staged)
            results = await asyncio.gather(*(self._ship_run(files, force) for files in runs.values()))
            self._failures = 0 if all(results) else self._failures + 1

    async def _ship_run(self, files: list[StagedFile], force: bool) -> bool:
        """Ship one run's files in name order; stop at the first failure (order must hold). True when all went."""
        for staged in files:
            if staged.forsaken:
                if staged.closed:
                    await asyncio.get_running_loop().run_in_executor(self._executor, self._stub, staged)
                    self._files.pop((staged.run_dir, staged.name), None)
                continue
            while staged.pending > 0 and (force or staged.closed or self._due(staged)):
                if not await self._upload(staged, raise_errors=False):
                    return False
            if staged.closed and staged.pending == 0:
                await asyncio.get_running_loop().run_in_executor(self._executor, self._stub, staged)
                self._files.pop((staged.run_dir, staged.name), None)
        return True

    def _due(self, staged: StagedFile) -> bool:
        if staged.uploaded < staged.wanted:
            return True
        now = self._clock()
        pending_age = 0.0 if staged.pending_since is None else now - staged.pending_since
        return self.policy.due(staged.pending, pending_age, now - staged.started)

    def _segment_end(self, staged: StagedFile) -> tuple[int, dict[str, int]]:
        """Where the next segment ends, and the last sequence number of each session in it: at the last batch
        that fits in `seal_bytes` with at most `segment_sessions.MAX_SESSIONS` sessions (at least one batch)."""
        start, end, held, taken = staged.uploaded, staged.size, dict[str, int](), False
        for size, session_id, last in staged.boundaries:
            if size <= start:
                continue
            grown = {**held, session_id: max(last, held.get(session_id, 0))} if session_id else held
            if taken and (size - start > self.policy.seal_bytes or len(grown) > segment_sessions.MAX_SESSIONS):
                break
            end, held, taken = size, grown, True
        return end, held

    async def _upload(self, staged: StagedFile, raise_errors: bool, held: dict[str, int] | None = None) -> bool:
        """Upload the next segment of `staged`'s pending bytes (naming the sessions `held` instead of its
        batches'). False (or raises) when the bucket refused; False when the lease does not admit it."""
        start = staged.uploaded
        if staged.attempt is not None and staged.attempt[0] == start:
            # An earlier put of this segment may have landed unrecorded (shutdown cancelled it after it went
            # out, or its answer was lost): a longer one at the same key would read as another daemon's fence.
            _, end, held = staged.attempt
        else:
            end, batches = self._segment_end(staged)
            held = batches if held is None else held
        if end <= start or staged.forsaken:
            return end <= start
        if self._fence is not None and not await self._fence.admit(staged.run_dir, staged.name):
            if not self._fence.holds(staged.run_dir):
                self._forsake(staged, "its lease is no longer held here")
            return False
        loop = asyncio.get_running_loop()
        path = os.path.join(self.staging_dir, staged.run_dir, staged.name)
        key = segment_key(staged.run_dir, staged.name, start)
        try:
            data = await loop.run_in_executor(self._executor, _read_range, path, start, end)
            metadata = {segment_sessions.ATTRIBUTE: segment_sessions.encode(held)} if held else None
            staged.attempt = (start, end, held)
            if not await self._put_segment(key, data, metadata):
                if self._fence is not None:
                    self._fence.fenced(staged.run_dir)
                self._forsake(staged, f"another daemon took its lease over and closed {key} to this one")
                return False
        except (BucketError, OSError) as exc:
            self.counters.failures += 1
            if raise_errors:
                raise BucketError(f"run {staged.run_dir}: uploading {key} failed: {exc}") from exc
            log.warning("run %s: uploading %s failed (kept staged, retrying): %s", staged.run_dir, key, exc)
            return False
        self.counters.count(end - start)
        if self.counters.objects == _EXIT_AFTER_UPLOADS:
            os._exit(70)
        # Counted as uploaded before the next await: a cancellation (the shipper stopped at shutdown) must not
        # land between the put and this, or the drain would upload the range again from the blocks given back
        # below, which read as zeros, over the good segment of the same key.
        staged.uploaded, staged.attempt = end, None
        staged.boundaries = [boundary for boundary in staged.boundaries if boundary[0] > end]
        staged.segments += 1
        staged.last_upload = self._last_uploads[staged.run_dir] = time.time()
        staged.pending_since = self._clock() if staged.pending > 0 else None
        self._progress.set()
        self._progress = asyncio.Event()
        if self._observer is not None:
            self._observer.uploaded(staged.run_dir, staged.name, end)
        with contextlib.suppress(OSError):
            await loop.run_in_executor(self._executor, release_uploaded, path, start, end)
        return True

    async def _put_segment(self, key: str, data: bytes, metadata: dict[str, str] | None) -> bool:
        """Create the segment `key` (never over an object there); False when another daemon's fence holds the
        key. An earlier attempt of this one that landed though its answer was lost counts as uploaded."""
        try:
            await self.bucket.create(key, data, metadata)
        except PreconditionFailedError:
            found = await self.bucket.size(key)
            if found != len(data) or not data:
                return False
            log.info("%s: an earlier attempt to upload it had landed", key)
        return True

    def _forsake(self, staged: StagedFile, why: str) -> None:
        if not staged.forsaken:
            log.error(
                "run %s: %s; its %d staged bytes not uploaded are left to the clients, which resend them to the "
                "run's new daemon",
                staged.run_dir,
                why,
                staged.pending,
            )
        staged.forsaken = True
        self._forsaken.add((staged.run_dir, staged.name))
        self._progress.set()
        self._progress = asyncio.Event()

    def _stub(self, staged: StagedFile) -> None:
        # Truncated, not deleted: the name stays, so that the run's next file sorts after it.
        os.truncate(os.path.join(self.staging_dir, staged.run_dir, staged.name), 0)

    async def _uploaded_ends(self, run_dir: str) -> dict[str, int]:
        """Per staged file name of `run_dir`: the end of its last uploaded segment."""
        ends: dict[str, int] = {}
        for name, offset, size in await run_segments(self.bucket, run_dir):
            ends[name] = max(ends.get(name, 0), offset + size)
        return ends


async def fence_file(bucket: Bucket, run_dir: str, name: str) -> str:
    """Close the staged file `name` of `run_dir` to the daemon that uploaded it (a takeover, before anything of
    the run is written): an empty object is created at the key its next segment would have. Segments are
    created only where no object is, one after another in offset order, so its holder can add none after it;
    a segment that lands first moves the fence past it. Return the fence's key.

    Raises:
        BucketError: the bucket could not be listed or written.
    """
    end = max(
        (offset + size for found, offset, size in await run_segments(bucket, run_dir) if found == name), default=0
    )
    for _ in range(_FENCE_ROUNDS):
        key = segment_key(run_dir, name, end)
        try:
            await bucket.create(key, b"")
            return key
        except PreconditionFailedError:
            size = await bucket.size(key)
            if size == 0:  # fenced already (by an earlier takeover that did not get to write it down)
                return key
            end += size or 0
    raise BucketError(f"run {run_dir}: {name} could not be fenced (its segments kept landing)")


async def run_segments(bucket: Bucket, run_dir: str) -> list[tuple[str, int, int]]:
    """`(file name, offset, size)` of every segment of `run_dir` in the bucket (not of the runs below it).

    Raises:
        BucketError: the run could not be listed.
    """
    found = []
    for info in await bucket.list(run_dir + "/"):
        parsed = parse_segment(info.key)
        if parsed is not None and parsed[0] == run_dir:
            found.append((parsed[1], parsed[2], info.size))
    return found


class SegmentIndex:
    """What the segments of a bucket logdir's runs say they hold (`segment_sessions`): read by a daemon that
    resumes a session from the bucket."""

    def __init__(self, bucket: Bucket) -> None:
        self.bucket = bucket

    async def end_key(self, run_dir: str) -> str:
        """A key that sorts after every segment of `run_dir` now: where the segments of a session that has
        none yet can begin.

        Raises:
            BucketError: the run could not be listed.
        """
        segments = await run_segments(self.bucket, run_dir)
        return max((segment_key(run_dir, name, offset + size) for name, offset, size in segments), default="")

    async def held(self, run_dir: str, session_id: str, since: str) -> int:
        """The highest sequence number of `session_id` in the segments of `run_dir` whose keys sort at or after
        `since` (0 when none names it). A session's numbers grow in the run's key order, so the newest segment
        that names it answers.

        Raises:
            BucketError: the run could not be listed, or a segment's metadata read.
        """
        tag = segment_sessions.session_tag(session_id)
        segments = sorted(
            ((name, offset) for name, offset, _ in await run_segments(self.bucket, run_dir)), reverse=True
        )
        for name, offset in segments:
            key = segment_key(run_dir, name, offset)
            if key < since:
                break
            metadata = await self.bucket.metadata(key) or {}
            last = segment_sessions.decode(metadata.get(segment_sessions.ATTRIBUTE, "")).get(tag)
            if last is not None:
                return last
        return 0


_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (Linux)
_BLOCK = 4096


@functools.cache
def _fallocate() -> Callable[..., int] | None:
    if sys.platform != "linux":
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    function.restype = ctypes.c_int
    typed: Callable[..., int] = function
    return typed


def release_uploaded(path: str, start: int, end: int) -> bool:
    """Give the disk blocks of the uploaded bytes `start`..`end` of a staged file back (punch a hole; its size
    and offsets stay), so that staging holds about the pending bytes only. False where the file system cannot.

    Every byte before `start` was uploaded too, so the hole may begin at the block that holds `start`.
    """
    fallocate = _fallocate()
    first, last = start - start % _BLOCK, end - end % _BLOCK
    if fallocate is None or last <= first:
        return False
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        return fallocate(fd, _PUNCH_HOLE, first, last - first) == 0
    finally:
        os.close(fd)


def _read_range(path: str, start: int, end: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        data = os.pread(fd, end - start, start)
    finally:
        os.close(fd)
    if len(data) != end - start:
        raise OSError(f"{path}: {len(data)} of {end - start} bytes at {start} (the staged file was cut)")
    return data


def _staged_files(staging_dir: str) -> dict[str, list[tuple[str, int]]]:
    """Non-empty event files in staging, per run directory, in name order."""
    found: dict[str, list[tuple[str, int]]] = {}
    for dirpath, dirnames, filenames in os.walk(staging_dir):
        dirnames.sort()
        run_dir = os.path.relpath(dirpath, staging_dir)
        for name in sorted(filenames):
            if "tfevents" not in name or run_dir == ".":
                continue
            size = os.lstat(os.path.join(dirpath, name)).st_size
            if size:
                found.setdefault(run_dir.replace(os.sep, "/"), []).append((name, size))
    return found
