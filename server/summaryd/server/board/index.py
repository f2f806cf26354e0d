"""The board index: every run's time series, sampled, in memory, for TensorBoard's data provider (`board`).

Events enter as TensorBoard reads them: each is migrated with TensorBoard's own `data_compat` and
`dataclass_compat` (legacy `simple_value`, `histo`, `image`, `audio`, graphs and hparams become tensors of a
data class), and its values go to one series per (run, tag), of the data class its first point declares:
scalars keep a float, tensors their `TensorProto`, blob sequences their blobs.

Each series is a reservoir as TensorBoard's (`Reservoir`): at most `capacity` points, chosen uniformly, the
newest always kept; a point whose step is not above the newest kept one is a restart, and the points at its
step and later give way (RustBoard's preemption). A `SessionLog.START` at step s, other than the run's first,
purges every series of its run at steps >= s (TensorBoard's Python loader's restart purge). Capacities are
per plugin (`SamplesPerPlugin`).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import logging
import os
import random
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

from google.protobuf.message import DecodeError
from tensorboard import data_compat, dataclass_compat
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import (
    DATA_CLASS_BLOB_SEQUENCE,
    DATA_CLASS_SCALAR,
    DATA_CLASS_TENSOR,
    Summary,
    SummaryMetadata,
)
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.util import tensor_util

from summaryd.server.board.marks import FileMark
from summaryd.server.operations.logs import Throttle
from summaryd.server.records.scalar_points import points
from summaryd.server.records.scalar_records import ScalarRecords

log = logging.getLogger("summaryd.server.board_index")  # the name log lines carry, kept across moves
_failures = Throttle(log)

# TensorBoard's defaults (`data_ingester.DEFAULT_TENSOR_SIZE_GUIDANCE`, and 10 for any other plugin).
DEFAULT_SAMPLES = {"scalars": 1000, "images": 10, "audio": 10, "histograms": 500, "pr_curves": 100}
OTHER_SAMPLES = 10
ALL = 0  # a capacity of 0 keeps every point

Value: TypeAlias = float | TensorProto | tuple[bytes, ...]


class SamplesPerPlugin:
    """Points kept per series, by plugin: TensorBoard's defaults, overridden like its `--samples_per_plugin`."""

    def __init__(self, overrides: dict[str, int] | None = None) -> None:
        self._capacity = {**DEFAULT_SAMPLES, **(overrides or {})}

    @classmethod
    def parse(cls, text: str) -> SamplesPerPlugin:
        """`scalars=1000,images=all,...`: a number of points, or `all` (or 0, as TensorBoard's flag takes it) for
        every point.

        Raises:
            ValueError: an entry is not PLUGIN=N or PLUGIN=all.
        """
        overrides: dict[str, int] = {}
        for entry in filter(None, (e.strip() for e in text.split(","))):
            plugin, sep, count = entry.partition("=")
            plugin, count = plugin.strip(), count.strip()
            if not sep or not plugin:
                raise ValueError(f"--samples-per-plugin entry {entry!r} needs PLUGIN=N or PLUGIN=all")
            if count == "all":
                overrides[plugin] = ALL
            elif count.isdigit():
                overrides[plugin] = int(count)
            else:
                raise ValueError(f"--samples-per-plugin {plugin}={count!r}: give a number of points, or all (or 0)")
        return cls(overrides)

    def capacity(self, plugin: str) -> int:
        return self._capacity.get(plugin, OTHER_SAMPLES)

    def describe(self) -> dict[str, int]:
        """The capacities set, by plugin (the saved index is taken up only with the same)."""
        return dict(sorted(self._capacity.items()))


@dataclass(slots=True)
class Datum:
    step: int
    wall_time: float
    value: Value


class Points(Protocol):
    """A series' kept points, in step order: a `list[Datum]`, or `ScalarPoints` for scalars."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> Datum: ...
    def __setitem__(self, index: int, datum: Datum) -> None: ...
    def __delitem__(self, index: slice) -> None: ...
    def __iter__(self) -> Iterator[Datum]: ...
    def append(self, datum: Datum) -> None: ...
    def pop(self, index: int) -> Datum: ...


class ScalarPoints:
    """Scalar points as three columns (24 bytes a point, where a list of `Datum` takes about 150), with their
    largest wall time kept (wall times mostly grow, so it is rarely recomputed)."""

    def __init__(self) -> None:
        self._step = array("q")
        self._wall_time = array("d")
        self._value = array("d")  # float32 values and float64 ones, both exact
        self._max_wall_time: float | None = 0.0

    @classmethod
    def of(cls, steps: array[int], wall_times: array[float], values: array[float]) -> ScalarPoints:
        """The points of these columns (taken, not copied)."""
        points = cls()
        points._step, points._wall_time, points._value = steps, wall_times, values
        points._max_wall_time = None
        return points

    def __len__(self) -> int:
        return len(self._step)

    def __getitem__(self, index: int) -> Datum:
        return Datum(self._step[index], self._wall_time[index], self._value[index])

    def __setitem__(self, index: int, datum: Datum) -> None:
        self._forget(self._wall_time[index])
        self._step[index], self._wall_time[index] = datum.step, datum.wall_time
        self._value[index] = float(datum.value)  # type: ignore[arg-type]
        self._grown(datum.wall_time)

    def __delitem__(self, index: slice) -> None:
        del self._step[index], self._wall_time[index], self._value[index]
        self._max_wall_time = None

    def __iter__(self) -> Iterator[Datum]:
        return map(Datum, self._step, self._wall_time, self._value)

    def append(self, datum: Datum) -> None:
        self._step.append(datum.step)
        self._wall_time.append(datum.wall_time)
        self._value.append(float(datum.value))  # type: ignore[arg-type]
        self._grown(datum.wall_time)

    def pop(self, index: int) -> Datum:
        datum = Datum(self._step.pop(index), self._wall_time.pop(index), self._value.pop(index))
        self._forget(datum.wall_time)
        return datum

    def columns(self, indices: Sequence[int]) -> tuple[Sequence[int], Sequence[float], Sequence[float]]:
        """The steps, wall times and values of the points at `indices` (in order)."""
        if isinstance(indices, range) and indices == range(len(self)):
            return self._step, self._wall_time, self._value
        return (
            [self._step[i] for i in indices],
            [self._wall_time[i] for i in indices],
            [self._value[i] for i in indices],
        )

    def take(
        self, kept: Sequence[int], steps: Sequence[int], wall_times: Sequence[float], values: Sequence[float]
    ) -> None:
        """Keep the points at `kept` (in order) of these points followed by the new ones given."""
        step, wall_time, value = self._step, self._wall_time, self._value
        step.extend(steps)
        wall_time.extend(wall_times)
        value.extend(values)
        if len(kept) < len(step):
            self._step = array("q", [step[i] for i in kept])
            self._wall_time = array("d", [wall_time[i] for i in kept])
            self._value = array("d", [value[i] for i in kept])
        self._max_wall_time = None

    def column_bytes(self) -> tuple[bytes, bytes, bytes]:
        """The steps, wall times and values as their machine bytes (`ScalarPoints.of` takes them back)."""
        return self._step.tobytes(), self._wall_time.tobytes(), self._value.tobytes()

    def max_wall_time(self) -> float:
        if self._max_wall_time is None:
            self._max_wall_time = max(self._wall_time, default=0.0)
        return self._max_wall_time

    def _grown(self, wall_time: float) -> None:
        if self._max_wall_time is not None and (wall_time > self._max_wall_time or len(self) == 1):
            self._max_wall_time = wall_time

    def _forget(self, wall_time: float) -> None:
        if self._max_wall_time is not None and wall_time >= self._max_wall_time:
            self._max_wall_time = None


class Reservoir:
    """Up to `capacity` points (0: all) sampled uniformly from those offered, the newest always kept.

    TensorBoard's `ReservoirBucket` with `always_keep_last`, seeded the same way (0) so samples repeat. The
    points stay in step order: one whose step is not above the newest purges from its step first.
    """

    def __init__(self, capacity: int, points: Points | None = None) -> None:
        self.capacity = capacity
        self.items: Points = [] if points is None else points
        self._seen = 0
        self._random = random.Random(0)

    @property
    def seen(self) -> int:
        """The points offered so far (less what purges took)."""
        return self._seen

    def resume(self, seen: int) -> None:
        """Go on from a saved sample of `seen` points (`saved`): the draws from a seed of their own."""
        self._seen = seen
        self._random = random.Random(seen)

    def offer(self, datum: Datum) -> None:
        if len(self.items) and datum.step <= self.items[-1].step:
            self.purge(datum.step)
        self._seen += 1
        if self.capacity == ALL or len(self.items) < self.capacity:
            self.items.append(datum)
            return
        r = self._random.randint(0, self._seen - 1)
        if r < self.capacity:
            self.items.pop(r)
            self.items.append(datum)
        else:
            self.items[-1] = datum

    def extend(self, steps: Sequence[int], wall_times: Sequence[float], values: Sequence[float]) -> None:
        """Offer scalar points in order, keeping what `offer` one at a time keeps (the same draws), at a
        fraction of the cost: indices are drawn, and the columns copied once."""
        items = self.items
        rising = all(a < b for a, b in itertools.pairwise(steps))
        if not isinstance(items, ScalarPoints) or not rising or (len(items) and steps[0] <= items[-1].step):
            for datum in map(Datum, steps, wall_times, values):
                self.offer(datum)
            return
        old, capacity, seen = len(items), self.capacity, self._seen
        kept = list(range(old))
        draw = self._random.randrange  # randrange(n) draws what offer's randint(0, n - 1) does
        for i in range(old, old + len(steps)):
            seen += 1
            if capacity == ALL or len(kept) < capacity:
                kept.append(i)
                continue
            r = draw(seen)
            if r < capacity:
                kept.pop(r)
                kept.append(i)
            else:
                kept[-1] = i
        self._seen = seen
        items.take(kept, steps, wall_times, values)

    def purge(self, step: int) -> None:
        """Drop the points at `step` and later; what was seen shrinks in proportion (as TensorBoard does)."""
        before = len(self.items)
        low, high = 0, before  # the first point at `step` or later: the points are in step order
        while low < high:
            middle = (low + high) // 2
            if self.items[middle].step < step:
                low = middle + 1
            else:
                high = middle
        del self.items[low:]
        if before:
            self._seen = round(self._seen * low / before)


@dataclass
class Series:
    """One (run, tag): its data class and metadata (from its first point) and its sampled points."""

    data_class: int
    metadata: SummaryMetadata
    reservoir: Reservoir

    @property
    def plugin(self) -> str:
        return str(self.metadata.plugin_data.plugin_name)

    @property
    def max_step(self) -> int:
        items = self.reservoir.items  # in step order: a step not above the last one purges from it first
        return items[-1].step if items else 0

    @property
    def max_wall_time(self) -> float:
        items = self.reservoir.items
        if isinstance(items, ScalarPoints):
            return items.max_wall_time()
        return max((d.wall_time for d in items), default=0.0)

    @property
    def max_length(self) -> int:
        return max((len(d.value) for d in self.reservoir.items if isinstance(d.value, tuple)), default=0)


@dataclass
class RunIndex:
    """The series of one run and its start (the wall time of its first event)."""

    samples: SamplesPerPlugin
    start_time: float | None = None
    series: dict[str, Series] = field(default_factory=dict)
    initial: dict[str, SummaryMetadata] = field(default_factory=dict)  # by tag: what dataclass_compat met first
    session_started: bool = False
    changes: int = 0  # counts what entered: an answer made from this run holds while it is unchanged
    answers: dict[object, tuple[int, bytes]] = field(default_factory=dict, repr=False, compare=False)
    """The provider's serialized answers about this run, by question, each with `changes` when it was made."""
    _plugins: tuple[int, frozenset[str]] | None = field(default=None, init=False, repr=False, compare=False)

    def plugins(self) -> frozenset[str]:
        """The plugins of its series that hold points (kept until the run changes)."""
        if self._plugins is None or self._plugins[0] != self.changes:
            held = frozenset(s.plugin for s in self.series.values() if len(s.reservoir.items))
            self._plugins = (self.changes, held)
        return self._plugins[1]

    def add_event(self, event: Event) -> None:
        self.changes += 1
        if event.wall_time and (
            self.start_time is None or (event.HasField("file_version") and event.wall_time < self.start_time)
        ):
            self.start_time = event.wall_time  # the first record of the run's first file (read later, maybe)
        if event.HasField("session_log") and event.session_log.status == SessionLog.START:
            # The run's first START is its start, not a restart (TensorBoard's loader purges from the second on):
            # a worker joining a run others log to with purge_step=0 takes nothing from them.
            if self.session_started:
                for series in self.series.values():
                    series.reservoir.purge(event.step)
            self.session_started = True
        if event.HasField("summary") and self._took_simple_values(event):
            return
        for migrated in data_compat_events(event, self.initial):
            if migrated.HasField("summary"):
                for value in migrated.summary.value:
                    self._add_value(migrated.step, migrated.wall_time, value)

    def add_records(self, records: Iterable[bytes]) -> None:
        """Take serialized events in their order, as `add_event` takes them, in bulk: an event of one
        `simple_value` of a known scalar series goes to its series' columns, offered together
        (`Reservoir.extend`) when another kind of event comes or the records end; about 3x quicker a point.
        A record that is no event, or one TensorBoard's migration refuses, is left out (logged, throttled)."""
        self.changes += 1
        gathered: dict[str, tuple[list[int], list[float], list[float]]] = {}
        series = self.series
        for data in records:
            try:
                event = Event.FromString(data)
            except DecodeError:
                continue
            if event.WhichOneof("what") == "summary":
                values = event.summary.value
                if len(values) == 1:
                    value = values[0]
                    known = series.get(value.tag)
                    if (
                        known is not None
                        and known.data_class == DATA_CLASS_SCALAR
                        and value.WhichOneof("value") == "simple_value"
                    ):
                        columns = gathered.get(value.tag)
                        if columns is None:
                            columns = gathered[value.tag] = ([], [], [])
                        columns[0].append(event.step)
                        columns[1].append(event.wall_time)
                        columns[2].append(value.simple_value)
                        continue
            if gathered:
                self._let_in(gathered)
                gathered = {}
            try:
                self.add_event(event)
            except Exception as exc:  # written already: an event the index cannot take must not stop the rest
                _failures.warning(
                    "board-event", "board: an event TensorBoard's migration refused is not indexed: %r", exc
                )
        self._let_in(gathered)

    def _let_in(self, gathered: dict[str, tuple[list[int], list[float], list[float]]]) -> None:
        for tag, (steps, wall_times, values) in gathered.items():
            self.series[tag].reservoir.extend(steps, wall_times, values)

    def _took_simple_values(self, event: Event) -> bool:
        """Take an event of `simple_value`s of known scalar series directly (most events: migrating one through
        TensorBoard's `data_compat` costs ~50x more); False, taking nothing, for any other event."""
        values = event.summary.value
        series = [self.series.get(v.tag) for v in values]
        if not all(
            s is not None and s.data_class == DATA_CLASS_SCALAR and v.WhichOneof("value") == "simple_value"
            for s, v in zip(series, values, strict=True)
        ):
            return False
        for s, v in zip(series, values, strict=True):
            assert s is not None
            s.reservoir.offer(Datum(event.step, event.wall_time, float(v.simple_value)))
        return True

    def add_scalar(self, tag: str, step: int, wall_time: float, number: float) -> None:
        """A point of a batch of scalar columns (what `add_scalar` sends: the scalars plugin's `simple_value`)."""
        self.changes += 1
        if self.start_time is None:
            self.start_time = wall_time
        series = self.series.get(tag)
        if series is None:
            event = Event(
                step=step, wall_time=wall_time, summary=Summary(value=[Summary.Value(tag=tag, simple_value=number)])
            )
            self.add_event(event)
        elif series.data_class == DATA_CLASS_SCALAR:
            series.reservoir.offer(Datum(step, wall_time, number))

    def _add_value(self, step: int, wall_time: float, value: Summary.Value) -> None:
        series = self.series.get(value.tag)
        if series is None:
            data_class = value.metadata.data_class
            if data_class not in (DATA_CLASS_SCALAR, DATA_CLASS_TENSOR, DATA_CLASS_BLOB_SEQUENCE):
                return  # no data class TensorBoard can serve (as TensorBoard itself drops it)
            metadata = SummaryMetadata()
            metadata.CopyFrom(value.metadata)
            capacity = self.samples.capacity(metadata.plugin_data.plugin_name)
            points = ScalarPoints() if data_class == DATA_CLASS_SCALAR else None
            series = self.series[value.tag] = Series(data_class, metadata, Reservoir(capacity, points))
        datum = _datum(series.data_class, step, wall_time, value)
        if datum is not None:
            series.reservoir.offer(datum)


def data_compat_events(event: Event, initial: dict[str, SummaryMetadata]) -> Iterable[Event]:
    """`event` as TensorBoard's loaders see it: legacy summaries as tensors with a data class."""
    migrated: Iterable[Event] = dataclass_compat.migrate_event(data_compat.migrate_event(event), initial)
    return migrated


def _datum(data_class: int, step: int, wall_time: float, value: Summary.Value) -> Datum | None:
    if value.WhichOneof("value") != "tensor":
        return None
    tensor = value.tensor
    try:
        if data_class == DATA_CLASS_SCALAR:
            return Datum(step, wall_time, float(tensor_util.make_ndarray(tensor).item()))
        if data_class == DATA_CLASS_BLOB_SEQUENCE:
            return Datum(step, wall_time, tuple(tensor.string_val))
    except (ValueError, TypeError):  # not the one number a scalar holds: TensorBoard drops it too
        return None
    kept = TensorProto()
    kept.CopyFrom(tensor)
    return Datum(step, wall_time, kept)


def blob_key(run: str, tag: str, step: int, index: int) -> str:
    """The key `ReadBlob` takes for blob `index` of a series' point at `step`."""
    return base64.urlsafe_b64encode(json.dumps([run, tag, step, index]).encode()).decode().rstrip("=")


def parse_blob_key(key: str) -> tuple[str, str, int, int]:
    """Raises ValueError: not a key `blob_key` made."""
    try:
        run, tag, step, index = json.loads(base64.urlsafe_b64decode(key + "=" * (-len(key) % 4)))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"blob key {key!r} is not one this daemon gave") from exc
    if not (isinstance(run, str) and isinstance(tag, str) and isinstance(step, int) and isinstance(index, int)):
        raise ValueError(f"blob key {key!r} is not one this daemon gave")
    return run, tag, step, index


class BoardIndex:
    """Every run's `RunIndex`, fed live after each batch is written (`written`) and by the runs already on disk
    (`backfill`). Its methods may be called from any thread; each holds the index's lock briefly."""

    def __init__(
        self,
        samples: SamplesPerPlugin | None = None,
        open_file: Callable[[str], tuple[str, float] | None] | None = None,
    ) -> None:
        """`open_file` names a run's open event file and its `file_version` wall time: a run first seen live
        starts then, as TensorBoard dates a run by the first record of its first file."""
        self.samples = samples or SamplesPerPlugin()
        self._open_file = open_file
        self._runs: dict[str, RunIndex] = {}
        self._lock = threading.Lock()
        # Runs whose older files (on disk, or in the bucket) are still being read: their live batches wait here.
        self._waiting: dict[str, list[Sequence[bytes]]] = {}
        self._own: dict[str, set[str]] = {}  # by run, the event files this process writes (a bucket skips them)
        self._read: dict[str, dict[str, int]] = {}  # by run, how far its files were read at the start
        self._asked: dict[str, None] = {}  # held runs TensorBoard asked for by name, in the order it asked

    def written(self, run_dir: str, session_id: str, events: Sequence[bytes]) -> None:
        """Take a batch right after it was written to `run_dir` (a `runs.WriteObserver`); never raises."""
        opened = self._open_file(run_dir) if self._open_file is not None else None
        with self._lock:
            if opened is not None:
                self._own.setdefault(run_dir, set()).add(opened[0])
            waiting = self._waiting.get(run_dir)
            if waiting is not None:
                waiting.append(events)
                return
            run = self._runs.get(run_dir)
            if run is None:
                run = self._runs[run_dir] = RunIndex(self.samples, start_time=opened[1] if opened else None)
            self._take(run, events)

    def owns(self, run_dir: str, file_name: str) -> bool:
        """Whether this process writes `file_name` of `run_dir` (its records come to `written`)."""
        with self._lock:
            return file_name in self._own.get(run_dir, ())

    def followed(self, run_dir: str, records: Sequence[bytes]) -> None:
        """Take records of `run_dir` written elsewhere (another daemon's segments, or from before the start), in
        their order, even while the run is held."""
        with self._lock:
            run = self._runs.get(run_dir)
            if run is None:
                run = self._runs[run_dir] = RunIndex(self.samples)
            self._take(run, records)

    def release(self, run_dir: str) -> None:
        """End a hold: the live batches that waited go in, in order."""
        with self._lock:
            run = self._runs.get(run_dir)
            if run is None:
                run = self._runs[run_dir] = RunIndex(self.samples)
            self._asked.pop(run_dir, None)
            for batch in self._waiting.pop(run_dir, []):
                self._take(run, batch)

    @staticmethod
    def _take(run: RunIndex, events: Sequence[bytes]) -> None:
        if isinstance(events, ScalarRecords):
            for tag, step, wall_time, value in points(events):
                run.add_scalar(tag, step, wall_time, value)
            return
        for data in events:
            try:
                run.add_event(Event.FromString(data))
            except DecodeError:  # refused before it was written; never reaches here
                continue
            except Exception as exc:  # the batch is written: an event the index cannot take must not fail it
                _failures.warning(
                    "board-event", "board: an event TensorBoard's migration refused is not indexed: %r", exc
                )

    def hold(self, run_dir: str) -> None:
        """Make `run_dir`'s live batches wait until its older files are read (`backfilled`)."""
        with self._lock:
            self._waiting.setdefault(run_dir, [])

    def backfilled(self, run_dir: str, run: RunIndex, read: dict[str, int]) -> None:
        """Install `run`, the index of `run_dir`'s files from before the start (read outside the lock) up to
        the offsets `read` (by file name), then its live batches that waited meanwhile."""
        with self._lock:
            self._runs[run_dir] = run
            self._read[run_dir] = read
            self._asked.pop(run_dir, None)
            for batch in self._waiting.pop(run_dir, []):
                self._take(run, batch)

    def marked(self, on_disk: dict[str, list[str]]) -> Iterator[tuple[str, RunIndex, list[FileMark]]]:
        """The runs whose every point is in the index (none still held), each with how far into each of its
        files (`on_disk`) its points go: as far as read at the start, the whole of a file this process wrote
        (its batches came to `written`), nothing of another. Called when nothing writes any more."""
        with self._lock:
            runs = [(name, run) for name, run in self._runs.items() if name not in self._waiting]
            read, own = dict(self._read), {name: set(files) for name, files in self._own.items()}
        for name, run in runs:
            marks: list[FileMark] = []
            for path in on_disk.get(name, []):
                file_name = os.path.basename(path)
                offset = read.get(name, {}).get(file_name)
                if offset is None and file_name in own.get(name, ()):
                    with contextlib.suppress(OSError):
                        offset = os.path.getsize(path)
                mark = FileMark.of(path, offset or 0)
                marks.append(mark if mark is not None else FileMark(file_name, 0, b""))
            if marks:
                yield name, run, marks

    def snapshot(self) -> Iterator[tuple[str, RunIndex]]:
        """The runs, by name, as (name, run) pairs; the caller reads them on the thread that feeds `written`."""
        with self._lock:
            runs = sorted(self._runs.items())
        return iter(runs)

    def named(self, names: Iterable[str]) -> list[tuple[str, RunIndex]]:
        """The runs of `names` there are, by name (a query naming its runs sorts those, not every run)."""
        with self._lock:
            found = [(name, self._runs[name]) for name in set(names) if name in self._runs]
        return sorted(found)

    def awaited(self) -> list[str]:
        """The held runs that live batches wait for, those written to first first."""
        with self._lock:
            return [run for run, batches in self._waiting.items() if batches]

    def asked(self, runs: Iterable[str]) -> None:
        """TensorBoard asked for these runs by name: a held one among them is read before the others."""
        with self._lock:
            for run in runs:
                if run in self._waiting:
                    self._asked.pop(run, None)
                    self._asked[run] = None  # the latest asked last

    def wanted(self) -> list[str]:
        """The held runs TensorBoard asked for, the latest asked first."""
        with self._lock:
            return [run for run in reversed(self._asked) if run in self._waiting]

    @property
    def pending_runs(self) -> int:
        """Runs already on disk whose files are not read yet."""
        with self._lock:
            return len(self._waiting)
