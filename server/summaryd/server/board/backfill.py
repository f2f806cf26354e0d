"""The runs already on a local logdir when the daemon starts, read into the board index in the background.

`Backfill` reads them on a thread of its own, one run after another, the ones something waits for first; with
`readers` above one and enough to read (`PARALLEL_BYTES`), in that many processes at once instead, since one
Python thread indexes about 250,000 events a second whatever the cores. A process reads a whole run into a
`RunIndex` of its own, exactly as the thread would (the same code, the same seeded draws), and hands it back
pickled; the daemon installs it. The daemon's own processes, started fresh (`spawn`: a fork would copy its
gRPC and event-loop threads' state), are the only ones it unpickles from.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import queue
import signal
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import google_crc32c

from summaryd.server.board.index import BoardIndex, RunIndex, SamplesPerPlugin
from summaryd.server.board.saved import Restored, SavedIndex
from summaryd.v1.wire import header

log = logging.getLogger("summaryd.server.board")  # the name log lines carry, kept across moves

# Below this many bytes of event files to read, the daemon's thread reads them: starting the processes (an
# interpreter and the index's imports each, about a second) would cost more than it saves.
PARALLEL_BYTES = 256 << 20


@dataclass(frozen=True)
class RunRead:
    """A run read: its index, how far into each file (by name) it went, and what stopped a file early."""

    run: RunIndex
    read: dict[str, int]
    problems: list[str]


def runs_on_disk(logdir: str) -> dict[str, list[str]]:
    """The event files already in a local logdir, by run (its directory relative to the logdir; "." for the
    logdir itself, as TensorBoard names it), each run's files in name order (TensorBoard's reading order)."""
    found: dict[str, list[str]] = {}
    for directory, _, files in os.walk(logdir):
        events = sorted(f for f in files if "tfevents" in f)
        if events:
            run = os.path.relpath(directory, logdir).replace(os.sep, "/")
            found[run] = [os.path.join(directory, f) for f in events]
    return found


def save_board(index: BoardIndex, saved: SavedIndex, logdir: str) -> None:
    """Save the index's runs (`SavedIndex`), with how far into its files on disk each goes; never raises (a
    daemon restarted without it reads its logdir again)."""
    started = time.monotonic()
    try:
        count = saved.save(index.marked(runs_on_disk(logdir)))
    except OSError as exc:
        log.error("board: saving the index to %s failed (%s); a restart reads every run again", saved.path, exc)
        return
    log.info("board: saved %d runs' samples to %s in %.1fs", count, saved.path, time.monotonic() - started)


class Backfill:
    """Reads the runs already on disk into the index, in the background; their live batches wait meanwhile
    (`BoardIndex.hold`), so that older points never come after newer ones. With `saved`, a run the daemon
    indexed before its restart is taken up from there and only what its files gained since is read. With
    `readers` above one, the runs are read in that many processes when there is enough to read."""

    def __init__(
        self,
        index: BoardIndex,
        runs: dict[str, list[str]],
        saved: SavedIndex | None = None,
        readers: int = 1,
        parallel_bytes: int = PARALLEL_BYTES,
    ) -> None:
        self._index = index
        self._runs = runs
        self._saved = saved
        self._readers = readers
        self._parallel_bytes = parallel_bytes
        self._stop = threading.Event()
        for run in runs:
            index.hold(run)
        self._thread = threading.Thread(target=self._read_all, name="summaryd-board-backfill", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the chunk being read, or the reading processes at once (blocks until the thread ends); the
        runs not read stay held."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def next_run(self, remaining: dict[str, list[str]]) -> str:
        """The run to read next: one being written to now (its live batches wait for it), else one TensorBoard
        asked for by name (the dashboard open on it waits), else the next in order."""
        for run in (*self._index.awaited(), *self._index.wanted()):
            if run in remaining:
                return run
        return next(iter(remaining))

    def _read_all(self) -> None:
        started = time.monotonic()
        restored = self._saved.load(self._runs) if self._saved is not None else {}
        taken_up = len(restored)
        remaining = dict(self._runs)
        if self._readers > 1 and _bytes_to_read(remaining, restored) >= self._parallel_bytes:
            finished = self._read_in_processes(remaining, restored)
        else:
            finished = self._read_here(remaining, restored)
        if finished:
            log.info(
                "board: read %d runs already on disk (%d taken up from the saved index) in %.1fs",
                len(self._runs),
                taken_up,
                time.monotonic() - started,
            )

    def _read_here(self, remaining: dict[str, list[str]], restored: dict[str, Restored]) -> bool:
        """Read the runs one after another on this thread; False when stopped first."""
        while remaining:
            name = self.next_run(remaining)
            found = read_run(self._index.samples, remaining.pop(name), restored.pop(name, None), self._stop)
            if found is None:
                return False
            self._install(name, found)
        return not self._stop.is_set()

    def _read_in_processes(self, remaining: dict[str, list[str]], restored: dict[str, Restored]) -> bool:
        """Read the runs in `readers` processes, one run each at a time, the next chosen as one finishes (so a
        run asked for meanwhile goes next); False when stopped first (the processes are ended at once)."""
        log.info("board: reading %d runs already on disk in %d processes", len(remaining), self._readers)
        done: queue.SimpleQueue[tuple[str, RunRead | BaseException]] = queue.SimpleQueue()
        context = multiprocessing.get_context("spawn")
        # Leaving the pool terminates its processes.
        with context.Pool(self._readers, initializer=_reader_started, initargs=(os.getpid(),)) as pool:
            reading: set[str] = set()
            while remaining or reading:
                while remaining and len(reading) < self._readers:
                    name = self.next_run(remaining)
                    paths = remaining.pop(name)
                    tell = functools.partial(_tell, done, name)
                    args = (self._index.samples, paths, restored.pop(name, None))
                    pool.apply_async(read_run, args, callback=tell, error_callback=tell)
                    reading.add(name)
                answer = self._next_answer(done)
                if answer is None:
                    return False
                name, found = answer
                reading.discard(name)
                if isinstance(found, BaseException):
                    # Not an unreadable file (those end its reading, as below): a process that failed. The run
                    # is read here instead, so that it is not left held.
                    log.error("board: a reading process failed on run %s (%r); reading it here", name, found)
                    again = read_run(self._index.samples, self._runs[name], None, self._stop)
                    if again is None:
                        return False
                    found = again
                self._install(name, found)
        return True

    def _next_answer(
        self, done: queue.SimpleQueue[tuple[str, RunRead | BaseException]]
    ) -> tuple[str, RunRead | BaseException] | None:
        """The next run a process finished with what it answered; None once stopped (looked at every 0.1 s)."""
        while not self._stop.is_set():
            with contextlib.suppress(queue.Empty):
                return done.get(timeout=0.1)
        return None

    def _install(self, name: str, found: RunRead) -> None:
        for problem in found.problems:
            log.warning("board: run %s: %s", name, problem)
        self._index.backfilled(name, found.run, found.read)


def _bytes_to_read(runs: dict[str, list[str]], restored: dict[str, Restored]) -> int:
    """The bytes of the runs' files beyond what the saved index holds of them."""
    total = 0
    for name, paths in runs.items():
        offsets = restored[name].offsets if name in restored else {}
        for path in paths:
            try:
                total += max(os.path.getsize(path) - offsets.get(os.path.basename(path), 0), 0)
            except OSError:
                continue
    return total


def _tell(done: queue.SimpleQueue[tuple[str, RunRead | BaseException]], name: str, found: object) -> None:
    """What a reading process answered for the run `name` (its `RunRead`, or what it raised)."""
    assert isinstance(found, (RunRead, BaseException))
    done.put((name, found))


def _reader_started(daemon: int) -> None:
    """A reading process of the process `daemon`: the daemon's Ctrl-C and stop are for the daemon, which ends
    its readers itself; a daemon killed outright cannot, so the process ends itself once the daemon is no longer
    its parent (a run's reading can take minutes, or hang on a stuck disk, and a process of a dead daemon must
    not outlive it). The daemon's pid comes from the daemon: one killed before this process got here has
    already left it to another parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_end_with, args=(daemon,), name="summaryd-board-reader-parent", daemon=True).start()


def _end_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)  # at once and quietly: nothing of its work is wanted any more


def read_run(
    samples: SamplesPerPlugin,
    paths: list[str],
    restored: Restored | None = None,
    stop: threading.Event | None = None,
) -> RunRead | None:
    """Read a run's files `paths` into its index (a fresh one, or `restored` read on from its offsets), records
    whole, CRCs checked in C, each file up to its first torn or corrupt record (where TensorBoard stops), in
    bulk (`RunIndex.add_records`: about 4 µs an event of one `simple_value`). None: `stop` was set meanwhile."""
    run = restored.run if restored is not None else RunIndex(samples)
    offsets = restored.offsets if restored is not None else {}
    read: dict[str, int] = {}
    problems: list[str] = []
    for path in paths:
        file_name = os.path.basename(path)
        read[file_name] = offsets.get(file_name, 0)
        try:
            for records, end in file_records(path, read[file_name]):
                if stop is not None and stop.is_set():
                    return None
                run.add_records(records)
                read[file_name] = end
        except OSError as exc:
            problems.append(f"reading {path} stopped: {exc}")
    return RunRead(run, read, problems)


_READ_BYTES = 4 << 20
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


def file_records(path: str, offset: int = 0) -> Iterator[tuple[list[bytes], int]]:
    """The whole records of an event file from `offset` on, a chunk at a time, each chunk with the offset its
    last record ends at; up to the first torn or corrupt record (where TensorBoard stops)."""
    with open(path, "rb") as f:
        f.seek(offset)
        pending = b""
        while chunk := f.read(_READ_BYTES):
            pending += chunk
            records, consumed = _whole(pending)
            offset += consumed
            if records:
                yield records, offset
            pending = pending[consumed:]
            if consumed == 0 and not _torn_at_end(pending):
                return  # a corrupt record, not one still being written: TensorBoard stops here too


def _torn_at_end(data: bytes) -> bool:
    """Whether `data` (starting at a record) is the start of one record longer than it, whose header is sound."""
    if len(data) < 12:
        return True
    (length,) = _LENGTH.unpack_from(data)
    return data[:12] == header(length) and 16 + length > len(data)


def _whole(data: bytes) -> tuple[list[bytes], int]:
    """The whole records at the start of `data` and the bytes they take: `wire.read_records` in one loop of
    locals, the length's CRC compared with the cached header of that length (a third quicker)."""
    records: list[bytes] = []
    offset, size = 0, len(data)
    unpack_length, unpack_crc, crc32c = _LENGTH.unpack_from, _CRC.unpack_from, google_crc32c.value
    while offset + 12 <= size:
        (length,) = unpack_length(data, offset)
        start = offset + 12
        end = start + length + 4
        if end > size or data[offset:start] != header(length):
            break
        record = data[start : end - 4]
        crc = crc32c(record)
        if unpack_crc(data, end - 4)[0] != (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF:
            break
        records.append(record)
        offset = end
    return records, offset
