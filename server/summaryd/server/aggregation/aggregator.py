"""Cross-worker aggregation: each scalar tag reduced over a run's workers, step by step, beside their runs.

The sessions of a run `<run>` whose workers write `<run>/<worker>` and declare a world size above one are
aggregated by the daemon that holds them: each step of each scalar tag is reduced over the workers into the
runs `<run>/mean`, `<run>/min`, `<run>/max`, `<run>/std` under the workers' own tag (so TensorBoard draws them
in the workers' chart), and `<run>/summaryd` holds `count/<tag>` (how many workers the step had) and
`lag_steps/<worker>` (how far each worker is behind the furthest one). Those worker labels are reserved.

`Aggregation` is the daemon's part: which sessions are aggregated, one `RunAggregator` per run while any of
them is live. It observes every batch written (`runs.WriteObserver`) and hands the batches of an aggregated
session to its run's `RunAggregator`, which keeps the pending steps (`step_table.StepTable`), finalises them as
they complete or on a timer on the event loop (the straggler timeout), and writes the reductions through the
daemon's own run writers, outside the batch's path. A tag's last finalised step is read back from the
aggregate runs' event files when the aggregator starts, so a step is never written twice, also across a
daemon restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import functools
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol

from google.protobuf.message import DecodeError
from tensorboard.compat.proto.event_pb2 import Event

from summaryd.server.aggregation.step_table import ColumnBatch, Reduction, StepTable, every_tag
from summaryd.server.errors import EventError
from summaryd.server.io_threads import run_to_completion
from summaryd.server.operations.logs import Throttle
from summaryd.server.operations.metrics import Metrics
from summaryd.server.records.scalar_points import Point, points
from summaryd.server.records.scalar_records import ScalarRecords
from summaryd.server.security.limits import DEFAULT, Limits
from summaryd.server.settings import option
from summaryd.server.storage.backend import Storage
from summaryd.server.storage.runs import ClosedFile, RunWriter
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1.wire import whole_records

log = logging.getLogger("summaryd.server.aggregation")  # the name log lines carry, kept across moves
_failures = Throttle(log)

REDUCTIONS = ("mean", "min", "max", "std")
STATS_RUN = "summaryd"
AGGREGATE_RUNS = (*REDUCTIONS, STATS_RUN)
RESERVED_WORKERS = frozenset(AGGREGATE_RUNS)
NO_STEP = -(2**63)  # before every step: a tag one aggregate run lacks is aggregated again from its first step
COUNT_PREFIX = "count/"
LAG_PREFIX = "lag_steps/"
MAX_TAG_PATTERNS = 64
REMEMBERED_RUNS = 1024  # runs whose last aggregated steps the daemon keeps after their aggregator stopped
REMEMBERED_TAGS = 100_000  # and the tags of those, over all runs (the oldest runs forgotten first)
FILTER_CACHE = 4096  # tags a session's filter remembers the answer for (beyond, it matches each time)


@dataclass(frozen=True)
class AggregationSettings:
    """The daemon's aggregation settings (`--aggregate/--no-aggregate`, `--straggler-secs`,
    `--aggregate-max-tags`)."""

    enabled: bool = option(
        True,
        "reduce each scalar tag of a multi-worker run across its workers into the runs RUN/mean, RUN/min, "
        "RUN/max, RUN/std and RUN/summaryd (counts and straggler lag); --no-aggregate turns it off",
        name="aggregate",
    )
    straggler_secs: float = option(
        30.0, "seconds a step's aggregate waits for workers that have not reported it before it is written", "SECS"
    )
    # Pending steps one run may hold; beyond it the oldest are finalised with the workers that reported them.
    max_pending_steps: int = 20_000
    # Tags one run's aggregation holds; further tags are not aggregated.
    max_tags: int = option(
        10_000,
        "scalar tags one run's aggregation holds; the points of further tags are not aggregated (counted and "
        "logged; they still reach their worker's run)",
        "N",
        name="aggregate_max_tags",
    )

    def __post_init__(self) -> None:
        if self.straggler_secs <= 0:
            raise ValueError("--straggler-secs must be positive")
        if self.max_tags <= 0:
            raise ValueError("--aggregate-max-tags must be positive")


# A daemon part built without settings (the session lifecycle alone) aggregates nothing.
AGGREGATION_OFF = AggregationSettings(enabled=False)


class Member(Protocol):
    """What aggregation reads of a live session (`sessions.live.Session`)."""

    @property
    def session_id(self) -> str: ...

    @property
    def worker(self) -> str: ...

    @property
    def ending(self) -> str | None: ...


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("stopping an idle aggregator failed: %r", task.exception())


class TagFilter:
    """Which tags a session has aggregated: every tag, or those matching its shell-style patterns."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self._patterns = tuple(patterns)
        self._known: dict[str, bool] = {}

    def __call__(self, tag: str) -> bool:
        if not self._patterns:
            return True
        wanted = self._known.get(tag)
        if wanted is None:
            wanted = any(fnmatch.fnmatchcase(tag, p) for p in self._patterns)
            if len(self._known) < FILTER_CACHE:
                self._known[tag] = wanted
        return wanted


class AggregateRuns:
    """The five aggregate runs of one run: their writers (and, on a bucket logdir, their leases) and their
    writing, as scalar columns through the daemon's run writers."""

    def __init__(self, run: str, storage: Storage, limits: Limits) -> None:
        self.run = run
        self._storage = storage
        self._limits = limits
        self._writers: dict[str, RunWriter] = {}
        self._owned = False  # the run (a bucket logdir: its lease), one count for the five runs
        # Per aggregate run, the tags it holds steps of beyond what the others reached (`WrittenThrough.ahead`):
        # those steps are not written to it again. Empty but for a daemon killed amid writing the five.
        self._ahead: dict[str, dict[str, int]] = {}

    @property
    def open(self) -> bool:
        return bool(self._writers)

    async def take(self) -> None:
        """Take the runs' leases (a bucket logdir) and writers.

        Raises:
            RunOwnedElsewhereError, OSError, LimitError: the daemon cannot write them (what it took is let go).
        """
        registry = self._storage.runs
        try:
            await self._storage.own(self.run)  # what its workers hold: the run, all its directories
            self._owned = True
            for name in AGGREGATE_RUNS:
                self._writers[name] = await registry.acquire([*self.run.split("/"), name], self._limits)
        except BaseException:
            await self.let_go()
            raise

    async def written_through(self, remembered: WrittenThrough | None) -> WrittenThrough:
        """Each tag's last step in the runs' files (and segments, on a bucket logdir), or `remembered`, the later."""
        written = WrittenThrough()
        written.merge(remembered)
        registry = self._storage.runs
        run_path = os.path.join(registry.logdir, self.run)
        await run_to_completion(registry.executor, lambda: written.read_local(run_path))
        await written.read_published(self._storage, self.run, registry.executor)
        written.settle()
        self._ahead = written.ahead
        return written

    async def unfinished(self, written: WrittenThrough) -> dict[str, list[Point]]:
        """Per worker, the points of its run's files (on the disk) beyond each tag's last written aggregate: the
        steps that were pending when a daemon was killed, whose points some workers had been told were written
        (and will not send again)."""
        registry = self._storage.runs
        run_path = os.path.join(registry.logdir, self.run)
        return await run_to_completion(registry.executor, lambda: _read_unfinished(run_path, written.last))

    async def write(self, done: list[Reduction], lag: Mapping[str, int] | None) -> None:
        """Write the reductions of `done` (ascending steps) and, when given, each worker's `lag` at the last step
        of `done`."""
        shared = _Columns(done)
        for name, writer in self._writers.items():
            columns = shared
            ahead = self._ahead.get(name)
            if ahead is not None:
                columns = _Columns(self._beyond(name, ahead, done))
            records = columns.count(lag, done[-1]) if name == STATS_RUN else columns.reduction(name)
            if records is None:
                continue
            try:
                await writer.write("", 0, ScalarRecords(records))
            except (OSError, EventError) as exc:
                _failures.warning(name, "run %s: aggregates not written: %s", writer.run_dir, exc)

    def _beyond(self, name: str, ahead: dict[str, int], done: list[Reduction]) -> list[Reduction]:
        """The reductions of `done` beyond what the aggregate run `name` already holds; a tag whose steps went
        past it is forgotten (and the run, once none is left)."""
        kept = [r for r in done if r.step > ahead.get(r.tag, NO_STEP)]
        for r in done:
            if ahead.get(r.tag, r.step) < r.step:
                del ahead[r.tag]
        if not ahead:
            del self._ahead[name]
        return kept

    async def let_go(self, shutdown: bool = False) -> list[ClosedFile]:
        """Let go of the writers (their closed files returned) and leases; at `shutdown` a bucket logdir's leases
        are kept: they are released after the last upload."""
        registry = self._storage.runs
        ends = [end for end in (w.end for w in self._writers.values()) if end is not None]
        closed = [await registry.release(writer) for writer in self._writers.values()]
        self._writers = {}
        if self._owned and not shutdown:
            # A bucket logdir: the lease goes once the runs' last staged bytes are uploaded (in the background).
            await self._storage.let_go(self.run, ends)
        self._owned = False
        return [file for file in closed if file is not None]


class _Columns:
    """The scalar columns of finalised reductions, one column of values per aggregate run."""

    def __init__(self, done: list[Reduction]) -> None:
        self.done = done
        table: dict[str, int] = {}
        self.index = [table.setdefault(r.tag, len(table)) for r in done]
        self.tags = list(table)
        self.steps, self.wall_times = [r.step for r in done], [r.wall_time for r in done]

    def reduction(self, name: str) -> pb.ScalarColumns | None:
        if not self.done:
            return None
        return pb.ScalarColumns(
            tags=self.tags,
            tag_index=self.index,
            step=self.steps,
            wall_time=self.wall_times,
            value=[getattr(r, name) for r in self.done],
        )

    def count(self, lag: Mapping[str, int] | None, last: Reduction) -> pb.ScalarColumns | None:
        """How many workers each step had and, when given, each worker's `lag` at the step of `last`."""
        if not self.done and lag is None:
            return None
        counts = pb.ScalarColumns(
            tags=[COUNT_PREFIX + tag for tag in self.tags],
            tag_index=self.index,
            step=self.steps,
            wall_time=self.wall_times,
            value=[r.count for r in self.done],
        )
        if lag is not None:
            workers = sorted(lag)
            start = len(self.tags)
            counts.tags.extend(LAG_PREFIX + worker for worker in workers)
            counts.tag_index.extend(range(start, start + len(workers)))
            counts.step.extend([last.step] * len(workers))
            counts.wall_time.extend([last.wall_time] * len(workers))
            counts.value.extend(lag[worker] for worker in workers)
        return counts


class RunAggregator:
    """The aggregation of one run: its pending steps, fed by its sessions' batches, finalised as they complete or
    on its timer, and written to its aggregate runs by a task of their own."""

    def __init__(self, runs: AggregateRuns, settings: AggregationSettings, metrics: Metrics | None = None) -> None:
        self.run = runs.run
        self._metrics = metrics
        self.sessions = 0
        self.table = StepTable(0, settings.max_pending_steps, max_tags=settings.max_tags)
        # Finalisations that raised (logged): the step table stays, the ticker goes on.
        self.failures = 0
        self.starting: asyncio.Future[bool] | None = None
        # Since when the run has had no session (None while it has one).
        self.idle_since: float | None = None
        self._runs = runs
        self._settings = settings
        self._ready: list[Reduction] = []
        self._writing: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._lag_step: int | None = None
        self._told = (0, 0, 0)  # the table's refused points, held and dropped steps when last logged
        self._final: WrittenThrough | None = None  # what it wrote through, once stopped (its table freed)
        self._completing: asyncio.Handle | None = None  # the finalising of the batches taken this loop iteration
        self._taken: list[tuple[str, Callable[[str], bool], Sequence[bytes]]] = []  # those batches

    @property
    def live(self) -> bool:
        """Whether it started and takes points."""
        return self._runs.open

    async def start(
        self,
        previous: asyncio.Future[list[ClosedFile]] | None,
        remembered: Callable[[], WrittenThrough | None],
        idle: Callable[[RunAggregator], None],
    ) -> bool:
        """Take the aggregate runs (after a previous aggregator of the run finished writing them) and read back
        each tag's last written step, from their files and from what this daemon `remembered` of an earlier
        aggregator of the run; False when this daemon cannot write them (logged). `idle` is told when the run
        went `--straggler-secs` without a session."""
        if previous is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(previous)
        try:
            await self._runs.take()
            written = await self._runs.written_through(remembered())
        except Exception as exc:
            log.warning("run %s: not aggregated: its aggregate runs could not be opened: %s", self.run, exc)
            await self._runs.let_go()
            return False
        self.table = StepTable(0, self._settings.max_pending_steps, written.last, self._settings.max_tags)
        self._lag_step = written.lag_step
        try:
            unfinished = await self._runs.unfinished(written)
        except Exception as exc:  # then those steps are aggregated from what the workers send again
            log.warning("run %s: steps pending before a restart not read back: %r", self.run, exc)
            unfinished = {}
        now = time.monotonic()
        for worker, found in unfinished.items():
            self.table.add_all(worker, found, written.last.__contains__, now)
        interval = min(max(self._settings.straggler_secs / 4, 0.05), 1.0)
        self._ticker = asyncio.create_task(self._tick(interval, idle))
        log.info("run %s: aggregating its workers' scalars (%d tags written before)", self.run, len(written.last))
        return True

    def take(self, worker: str, wanted: Callable[[str], bool], events: Sequence[bytes]) -> None:
        """Take the scalar points of a batch `worker` wrote (on the event loop, right after it was written).

        The batches written in one iteration of the event loop (a group commit's are answered in one) are taken
        together at its end, and finalised once: each finalising looks at every tag it touched, and many ranks'
        points of the same steps are taken as columns at once (`StepTable.add_columns`)."""
        if not self.live:
            return
        self._taken.append((worker, wanted, events))
        if self._completing is None:
            self._completing = asyncio.get_running_loop().call_soon(self._complete_taken)

    def _complete_taken(self) -> None:
        self._completing = None
        if self.live:
            self._take_batches()
            self._finalising(self.table.complete, "the batches just taken")

    def _take_batches(self) -> None:
        """Put the batches taken since into the step table (before anything else reads or changes it)."""
        taken, self._taken = self._taken, []
        if not taken:
            return
        now = time.monotonic()
        try:
            _add_batches(self.table, taken, now)
        except Exception:  # aggregation never fails the workers' batches; one that cannot be taken fails alone
            for worker, wanted, events in taken:
                try:
                    self.table.add_all(worker, points(events), wanted, now)
                except Exception:
                    self._failed(f"a batch of worker {worker}")

    def joined(self, worker: str, world_size: int) -> None:
        """A session of `worker` opened (see `StepTable.joined`)."""
        self._take_batches()
        self.table.joined(worker, world_size)

    def departed(self, worker: str) -> None:
        if self.live:
            self._take_batches()
            try:
                self.table.departed(worker)
                self._finish(self.table.complete())
            except Exception:
                self._failed(f"the departure of worker {worker}")

    async def _tick(self, interval: float, idle: Callable[[RunAggregator], None]) -> None:
        straggler = self._settings.straggler_secs
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            self._take_batches()
            try:
                self._finish(self.table.overdue(now, straggler))
            except Exception:  # one bad finalisation must not stop the timer (stragglers, idle release)
                self._failed("its overdue steps")
            if self.sessions == 0 and self.idle_since is not None and now - self.idle_since >= straggler:
                idle(self)

    def _finalising(self, finalise: Callable[[], list[Reduction]], what: str) -> None:
        """Write what `finalise` finalises; one that raises is logged (the aggregator goes on)."""
        try:
            self._finish(finalise())
        except Exception:
            self._failed(what)

    def _failed(self, what: str) -> None:
        self.failures += 1
        if self._metrics is not None:
            self._metrics.aggregation_failures.inc()
        log.exception("run %s: %s not aggregated (%d such failures)", self.run, what, self.failures)

    def _tell(self) -> None:
        """Log, rate-limited, the points of tags over the limit and the steps held or dropped beyond the frontier
        since last told."""
        table, (refused, held, dropped) = self.table, self._told
        if table.refused_points > refused:
            _failures.warning(
                "aggregate-tags",
                "run %s: tag %r and others not aggregated: the run's aggregation holds %d tags, the limit "
                "(--aggregate-max-tags); %d points not aggregated so far (they are in their workers' runs)",
                self.run,
                table.refused_tag,
                table.tag_count,
                table.refused_points,
            )
        if table.held_steps > held:
            _failures.warning(
                "aggregate-ahead",
                "run %s: %d overdue steps held so far: beyond the run's second-furthest worker (step %s), they "
                "wait for another worker to get there",
                self.run,
                table.held_steps,
                table.frontier(),
            )
        if table.dropped_steps > dropped:
            _failures.warning(
                "aggregate-dropped",
                "run %s: %d pending steps not written so far: beyond the run's second-furthest worker (step %s) "
                "when the pending bound or the run's end came",
                self.run,
                table.dropped_steps,
                table.frontier(),
            )
        if self._metrics is not None:
            self._metrics.aggregation_points_refused.inc(table.refused_points - refused)
            self._metrics.aggregation_steps_held.inc(table.held_steps - held)
            self._metrics.aggregation_steps_dropped.inc(table.dropped_steps - dropped)
        self._told = (table.refused_points, table.held_steps, table.dropped_steps)

    def _finish(self, done: list[Reduction]) -> None:
        if self._told != (self.table.refused_points, self.table.held_steps, self.table.dropped_steps):
            self._tell()
        if not done:
            return
        self._ready += done
        if self._writing is None or self._writing.done():
            self._writing = asyncio.create_task(self._write_ready())

    async def _write_ready(self) -> None:
        while self._ready:
            done, self._ready = sorted(self._ready, key=lambda r: r.step), []
            # The lag is written at each newly finalised step, so that its tags' steps only go forward too.
            advanced = self._lag_step is None or done[-1].step > self._lag_step
            if advanced:
                self._lag_step = done[-1].step
            try:
                await self._runs.write(done, self.table.lag() if advanced else None)
            except Exception:  # not an I/O error (those are logged by the write): a bug, the next batch goes on
                self._failed(f"{len(done)} finalised steps")

    def written(self) -> WrittenThrough:
        """Each tag's last finalised step, and the last step of the lag scalars."""
        if self._final is not None:
            return self._final
        written = WrittenThrough()
        written.last, written.lag_step = self.table.last_final(), self._lag_step
        return written

    async def stop(self, shutdown: bool = False) -> list[ClosedFile]:
        """Finalise what is pending, write it, and let go of the aggregate runs; their closed files returned.
        The step table is freed: only what was written through is kept (`written`)."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self._completing is not None:  # `drain` finalises what it would have
            self._completing.cancel()
            self._completing = None
        if self.live:
            self._take_batches()
            self._finalising(self.table.drain, "its pending steps")
        while self._writing is not None and not self._writing.done():
            await self._writing
        self._final = self.written()
        self.table = StepTable(0, 0, max_tags=0)
        return await self._runs.let_go(shutdown)


# Batches in a loop iteration from which they are taken as columns (numpy): then a step of a tag takes many
# ranks' points at once, and numpy's fixed costs per tag and step are less than those points one by one.
_COLUMNS_FROM = 16


def _add_batches(table: StepTable, taken: list[tuple[str, Callable[[str], bool], Sequence[bytes]]], now: float) -> None:
    """Put batches (worker, tag filter, events) into `table` in order: the batches of scalar columns as columns
    (`StepTable.add_columns`) when there are enough batches for numpy's fixed costs, the rest point by point."""
    if len(taken) < _COLUMNS_FROM:
        for worker, wanted, events in taken:
            table.add_all(worker, points(events), wanted, now)
        return
    columns: list[ColumnBatch] = []
    for worker, wanted, events in taken:
        if isinstance(events, ScalarRecords):
            arrays = events.column_arrays()
            tags = events.tags
            columns.append(
                ColumnBatch(worker, tags, arrays.tag_index, arrays.steps, arrays.wall_times, arrays.values, wanted)
            )
            continue
        table.add_columns(columns, now)
        columns = []
        table.add_all(worker, points(events), wanted, now)
    table.add_columns(columns, now)


def _read_unfinished(run_path: str, last: Mapping[str, int]) -> dict[str, list[Point]]:
    """Per worker run below `run_path` (a directory of event files, not an aggregate run's), its points of the
    tags of `last` at steps beyond them (blocking: parses the files)."""
    found: dict[str, list[Point]] = {}
    if not last:
        return found
    try:
        entries = sorted(os.scandir(run_path), key=lambda e: e.name)
    except FileNotFoundError:
        return found
    for entry in entries:
        if entry.name in RESERVED_WORKERS or not entry.is_dir():
            continue
        files = sorted(n for n in os.listdir(entry.path) if "tfevents" in n)
        kept: list[Point] = []
        for name in files:
            with open(os.path.join(entry.path, name), "rb") as f:
                records = list(whole_records(f.read()))
            kept.extend(p for p in points(records) if p[1] > last.get(p[0], p[1]))
        if kept:
            found[entry.name] = kept
    return found


class WrittenThrough:
    """Each tag's last step in the aggregate runs' records, and the last step of the lag scalars.

    The five runs are written one after the other, so a daemon killed between two of them leaves some runs a
    step ahead of the others: `last` is, per tag, the step every run reached (the steps beyond are aggregated
    again from the workers' runs), and `ahead` what each run holds beyond it (not written to it again).
    """

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        self.ahead: dict[str, dict[str, int]] = {}
        self.lag_step: int | None = None
        self._runs: dict[str, dict[str, int]] = {name: {} for name in AGGREGATE_RUNS}

    def merge(self, other: WrittenThrough | None) -> None:
        """Take the later of each tag's step here and in `other` (in every run: `other` was written whole)."""
        if other is not None:
            for steps in self._runs.values():
                for tag, step in other.last.items():
                    steps[tag] = max(steps.get(tag, step), step)
            self._lag_at(other.lag_step)

    def settle(self) -> None:
        """Compute `last` and `ahead` from what was read of each run."""
        tags = set().union(*self._runs.values())
        self.last = {tag: min(steps.get(tag, NO_STEP) for steps in self._runs.values()) for tag in tags}
        self.ahead = {}
        for name, steps in self._runs.items():
            beyond = {tag: step for tag, step in steps.items() if step > self.last[tag]}
            if beyond:
                self.ahead[name] = beyond

    def _lag_at(self, step: int | None) -> None:
        if step is not None and (self.lag_step is None or step > self.lag_step):
            self.lag_step = step

    def read(self, name: str, data: bytes) -> None:
        """Take the whole records of `data` (an event file, or a segment of one) of the aggregate run `name`
        (blocking: parses them)."""
        last = self._runs[name]
        for record in whole_records(data):
            try:
                event = Event.FromString(record)
            except DecodeError:
                continue
            step = event.step
            for value in event.summary.value:
                tag = value.tag
                if name == STATS_RUN:
                    if tag.startswith(LAG_PREFIX):
                        self._lag_at(step)
                    if not tag.startswith(COUNT_PREFIX):
                        continue  # the lag, or not aggregation's (the watch's `watch/<rule>` findings)
                    tag = tag[len(COUNT_PREFIX) :]
                last[tag] = max(last.get(tag, step), step)

    def read_local(self, run_path: str) -> None:
        """Read the event files of the aggregate runs below `run_path` (blocking)."""
        for name in AGGREGATE_RUNS:
            directory = os.path.join(run_path, name)
            try:
                files = sorted(n for n in os.listdir(directory) if "tfevents" in n)
            except FileNotFoundError:
                continue
            for file in files:
                with open(os.path.join(directory, file), "rb") as f:
                    self.read(name, f.read())

    async def read_published(self, storage: Storage, run: str, executor: Executor) -> None:
        """Read what the storage holds of the aggregate runs of `run` beyond the disk (a bucket's segments: a
        staged file is emptied once it is uploaded, so the bucket holds what the staging directory no longer
        does)."""
        for name in AGGREGATE_RUNS:
            async for data in storage.published(f"{run}/{name}"):
                await run_to_completion(executor, functools.partial(self.read, name, data))


class Aggregation:
    """The daemon's aggregation: which sessions are aggregated, and a `RunAggregator` per run while they live.

    A `runs.WriteObserver`: every batch written is handed to the aggregator of its session, if it has one.
    """

    def __init__(
        self,
        storage: Storage,
        settings: AggregationSettings | None = None,
        limits: Limits = DEFAULT,
        closed: Callable[[list[ClosedFile]], Awaitable[None]] | None = None,
    ) -> None:
        """`closed` is told of the closed files of an aggregator that stopped on its own (idle), for their
        records (the session lifecycle's store)."""
        self.settings = settings or AGGREGATION_OFF
        self._storage = storage
        self._limits = limits
        self._closed = closed
        self._runs: dict[str, RunAggregator] = {}
        self._members: dict[str, RunAggregator] = {}  # by session id
        # By session id: where its batches go (its aggregator, with its worker and tag filter), once started.
        self._feeds: dict[str, Callable[[Sequence[bytes]], None]] = {}
        self._stopping: dict[str, asyncio.Future[list[ClosedFile]]] = {}
        self._remembered: OrderedDict[str, WrittenThrough] = OrderedDict()
        self._remembered_tags = 0
        self._metrics = storage.runs.metrics
        if self._metrics is not None:
            self._metrics.aggregation_tags.set_function(self.held_tags)
            self._metrics.aggregation_remembered_tags.set_function(self.remembered_tags)

    def open_problem(self, request: pb.OpenSessionRequest) -> str | None:
        """Why an `OpenSession` is refused for aggregation's sake (a worker label that names an aggregate run,
        too many or too long tag patterns), or None."""
        if self.settings.enabled and request.worker in RESERVED_WORKERS:
            return (
                f"worker label {request.worker!r} is reserved for the daemon's aggregates of the run "
                f"({', '.join(sorted(RESERVED_WORKERS))}); label the worker otherwise, e.g. 'rank-0'"
            )
        patterns = request.aggregate_tags
        if len(patterns) > MAX_TAG_PATTERNS:
            return f"aggregate_tags has {len(patterns)} patterns, over the limit of {MAX_TAG_PATTERNS}; merge them"
        longest = max((len(p.encode()) for p in patterns), default=0)
        if longest > self._limits.max_tag_bytes:
            return (
                f"aggregate_tags has a pattern of {longest} bytes, over the limit of {self._limits.max_tag_bytes} "
                "bytes (--max-tag-bytes)"
            )
        return None

    def written(self, run_dir: str, session_id: str, events: Sequence[bytes]) -> None:
        """A batch of `session_id` was written: its aggregator takes its points (the daemon's own records,
        and sessions not aggregated, have none)."""
        feed = self._feeds.get(session_id)
        if feed is not None:
            feed(events)

    def _wanted(self, request: pb.OpenSessionRequest) -> bool:
        return self.settings.enabled and request.world_size > 1 and bool(request.worker) and not request.aggregate_off

    async def joined(self, session: Member, request: pb.OpenSessionRequest, parts: list[str]) -> None:
        """Aggregate the new live `session` (run path `parts`, its worker last) when it asks for it."""
        if not self._wanted(request):
            return
        run = "/".join(parts[:-1])
        aggregator = self._runs.get(run)
        if aggregator is None:
            runs = AggregateRuns(run, self._storage, self._limits)
            aggregator = self._runs[run] = RunAggregator(runs, self.settings, self._metrics)
            aggregator.starting = asyncio.ensure_future(
                aggregator.start(self._stopping.get(run), functools.partial(self._remembered.get, run), self._idle)
            )
        aggregator.sessions += 1
        aggregator.idle_since = None
        self._members[session.session_id] = aggregator
        assert aggregator.starting is not None
        if await asyncio.shield(aggregator.starting) and session.ending is None:
            aggregator.joined(session.worker, request.world_size)
            # Every tag: the step table's own filter, which it knows without a call per tag.
            wanted = TagFilter(request.aggregate_tags) if request.aggregate_tags else every_tag
            self._feeds[session.session_id] = functools.partial(aggregator.take, session.worker, wanted)

    async def left(self, session: Member, others: Sequence[Member], stopping: bool = False) -> list[ClosedFile]:
        """`session` ended; `others` are the live sessions of its worker (or more). When it was the run's last and
        the whole world has left (every worker's last session closed or released), or the daemon is `stopping`,
        the run's aggregator stops: its pending steps are finalised and written, and the closed files of its
        aggregate runs returned for their records. Otherwise the aggregator waits for the other workers (which a
        daemon restart, or their own, may bring back later) until `--straggler-secs` pass without a session."""
        aggregator = self._members.pop(session.session_id, None)
        if aggregator is None:
            return []
        self._feeds.pop(session.session_id, None)
        if not any(self._members.get(s.session_id) is aggregator and s.worker == session.worker for s in others):
            aggregator.departed(session.worker)
        aggregator.sessions -= 1
        if aggregator.sessions > 0:
            return []
        if stopping or aggregator.table.world_left() or not aggregator.live:
            return await self._stop(aggregator, stopping)
        aggregator.idle_since = time.monotonic()
        return []

    async def close_all(self) -> list[ClosedFile]:
        """Stop every aggregator (shutdown); the closed files of their aggregate runs returned."""
        closed: list[ClosedFile] = []
        for aggregator in list(self._runs.values()):
            closed += await self._stop(aggregator, shutdown=True)
        return closed

    def _idle(self, aggregator: RunAggregator) -> None:
        """`aggregator` went without a session for `--straggler-secs`: stop it (its ticker tells)."""
        if self._runs.get(aggregator.run) is aggregator and aggregator.sessions == 0:
            task = asyncio.ensure_future(self._stop_idle(aggregator))
            task.add_done_callback(_log_failure)

    async def _stop_idle(self, aggregator: RunAggregator) -> None:
        closed = await self._stop(aggregator)
        if closed and self._closed is not None:
            await self._closed(closed)

    async def _stop(self, aggregator: RunAggregator, shutdown: bool = False) -> list[ClosedFile]:
        run = aggregator.run
        if self._runs.get(run) is aggregator:
            del self._runs[run]
        stopping = self._stopping[run] = asyncio.ensure_future(aggregator.stop(shutdown))
        try:
            return await asyncio.shield(stopping)
        finally:
            written = aggregator.written()
            if written.last:
                self._remember(run, written)
            if self._stopping.get(run) is stopping:
                del self._stopping[run]

    def _remember(self, run: str, written: WrittenThrough) -> None:
        """Keep what a stopped aggregator wrote through, for the run's next one (its files may not say all of it
        yet: on a bucket logdir a closed file goes up in the background and its staged copy is emptied)."""
        remembered = self._remembered
        if run in remembered:
            self._remembered_tags -= len(remembered.pop(run).last)
        remembered[run] = written
        self._remembered_tags += len(written.last)
        while len(remembered) > 1 and (len(remembered) > REMEMBERED_RUNS or self._remembered_tags > REMEMBERED_TAGS):
            self._remembered_tags -= len(remembered.popitem(last=False)[1].last)

    def held_tags(self) -> int:
        """The tags whose state the live aggregators hold."""
        return sum(aggregator.table.tag_count for aggregator in tuple(self._runs.values()))

    def remembered_tags(self) -> int:
        """The tags of the runs whose last aggregated steps are remembered."""
        return self._remembered_tags

    def lag(self, session: Member) -> int | None:
        """How many steps the session's worker is behind its run's furthest worker; None when not aggregated."""
        aggregator = self._members.get(session.session_id)
        if aggregator is None or not aggregator.live:
            return None
        return aggregator.table.lag().get(session.worker, 0)
