"""One run's watch: its workers and series, the checks run on each batch, and the rules evaluated on each tick.

Work is split by cost. On each batch (`RunWatch.take`, on the event loop right after the write) only what must
see every point: the batch's arrival and last (step, wall time); one reduction over its values (their sum is
finite exactly when every value is); and the points of the tags divergence watches, each compared with its
series' threshold. On each tick (`RunWatch.evaluate`, a few times a second) the rules: silence and stragglers
from the workers' arrivals and step times, the divergence thresholds (median and MAD of a series' window) of the
series that got points, and which findings hold and which have ended.
"""

from __future__ import annotations

import bisect
import fnmatch
import functools
import math
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from summaryd.server.records.scalar_events import EventBatch
from summaryd.server.records.scalar_points import event_point_columns
from summaryd.server.records.scalar_records import ScalarRecords
from summaryd.server.sessions.live import Session
from summaryd.server.watch._findings import Finding, Key
from summaryd.server.watch._rules import DivergenceRule, Rules

_SAMPLES = 32  # batches a worker's cadence and step time are measured over
_LONG_GAP_SECS = 600.0  # the period a worker's longest pause is remembered for (one to two of them)
_MAD_SIGMA = 1.4826  # the MAD of a normal distribution times this is its standard deviation
_INF = math.inf
_FEW_SCALARS = 128  # scalars up to which a batch is read as lists: numpy's fixed cost per call is more
Values = list[float] | NDArray[np.float32]


class Series:
    """One (rank, tag) that divergence watches: a ring of its last points below threshold (the baseline), and its
    state: points above threshold in a row, and, while firing, points below the resolve level in a row."""

    __slots__ = (
        "armed",
        "at",
        "dirty",
        "firing",
        "first",
        "over",
        "resolve_below",
        "size",
        "threshold",
        "under",
        "window",
    )

    def __init__(self, size: int) -> None:
        # Grown to `size` points, then a ring: 1 KiB for 128 points, as a list's floats are not.
        self.window = array("d")
        self.size = size
        self.at = self.over = self.under = 0
        self.threshold, self.resolve_below = _INF, -_INF
        self.firing, self.dirty = False, False
        # Watched once it has fallen (its newest quarter's median under its oldest's): a loss that only ever
        # rose (a ramp, a counter named loss) is not taken for one that diverged.
        self.armed = False
        self.first = (0, 0.0)  # step and value of the first point of the current run above threshold

    def add(self, values: Values, steps: Callable[[], list[int]], rule: DivergenceRule, clean: bool) -> None:
        """Take a batch's points of the series, in order (`clean`: the batch has no non-finite value); `steps`
        gives their steps, asked for only when a point is not simply kept."""
        if clean and not self.firing and self.over == 0:
            # The common case: every point under threshold goes to the baseline at once. Under an infinite one
            # (none yet: too few points, or not armed) a clean batch's points all are, without a look at them.
            unbound = self.threshold == _INF
            if isinstance(values, np.ndarray):
                if unbound or float(values.max()) <= self.threshold:
                    # Only the points the ring keeps, copied as float64 bytes: extending an array from a list
                    # of 128 floats costs ten times as much.
                    self._keep(array("d", values[-self.size :].astype(np.float64).tobytes()))
                    return
            elif unbound or max(values) <= self.threshold:
                self._keep(values)
                return
        listed: list[float] = values.tolist() if isinstance(values, np.ndarray) else values
        isfinite = math.isfinite
        for step, value in zip(steps(), listed, strict=True):
            if not isfinite(value):  # the non-finite rule's to tell
                continue
            if self.firing:
                self.under = self.under + 1 if value <= self.resolve_below else 0
                if self.under >= rule.resolve_points:
                    self.firing, self.over, self.under = False, 0, 0
            elif value > self.threshold:
                if self.over == 0:
                    self.first = (step, value)
                self.over += 1
                self.firing = self.over >= rule.for_points
            else:
                self.over = 0
                self._keep([value])

    def _keep(self, values: list[float] | array[float]) -> None:
        window, size = self.window, self.size
        room = size - len(window)
        if room > 0:  # still growing: the points go on its end (`at` stays 0: the oldest is first)
            window.extend(values[:room])
            values = values[room:]
        count = len(values)
        if not count:
            pass
        elif count >= size:
            window[:] = array("d", values[-size:])
            self.at = 0
        else:
            first = min(count, size - self.at)
            window[self.at : self.at + first] = array("d", values[:first])
            window[: count - first] = array("d", values[first:])
            self.at = (self.at + count) % size
        self.dirty = True

    def rebase(self, rule: DivergenceRule) -> None:
        """Recompute the threshold from the window (not while firing: the baseline is frozen then). In plain
        Python: on a window of 128 points, sorting it costs a fraction of numpy's fixed cost per call."""
        self.dirty = False
        window = self.window
        if self.firing or len(window) < rule.warmup:
            return
        ordered = window[self.at :] + window[: self.at] if self.at else window[:]
        quarter = max(len(ordered) // 4, 1)
        # The newest quarter of the window (the current level), and the oldest (where it started from).
        newest = _median(sorted(ordered[-quarter:]))
        if not self.armed:
            self.armed = newest < _median(sorted(ordered[:quarter]))
            if not self.armed:
                return
        low, median = min(ordered), _median(sorted(ordered))
        mad = _median(sorted([abs(v - median) for v in ordered]))
        spread = max(_MAD_SIGMA * mad, 1e-3 * sum(map(abs, ordered)) / len(ordered))
        spike = median + rule.spike_mads * spread if spread > 0 else _INF
        self.threshold = min(spike, rule.ratio * low if low > 0 else _INF)
        level = min(newest, self.threshold)
        self.resolve_below = (level + self.threshold) / 2


def _median(ordered: list[float]) -> float:
    """The median of sorted, non-empty `ordered`."""
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclass(eq=False, slots=True)
class Worker:
    """One worker (rank) of a run: its session, when its batches arrived, and its steps' wall times."""

    rank: str
    session: Session | None
    batches: int = 0
    last_arrival: float = 0.0
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=_SAMPLES))
    samples: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=_SAMPLES))
    last_step: int = 0
    released_at: float | None = None
    slow_since: float | None = None
    fast_since: float | None = None
    silent_after: float = _INF
    # The longest gap between batches in this and the last period of `_LONG_GAP_SECS`: a pause the worker makes
    # regularly (a checkpoint, an evaluation) is learnt once and not taken for a hang again.
    long_gaps: list[float] = field(default_factory=lambda: [0.0, 0.0])
    period_start: float = 0.0

    def arrived(self, now: float) -> None:
        if self.batches:
            gap = now - self.last_arrival
            if gap > self.silent_after:
                self.samples.clear()  # a pause (a stopped process) is no measure of its step time
            self.intervals.append(gap)
            if now - self.period_start > _LONG_GAP_SECS:
                self.long_gaps, self.period_start = [self.long_gaps[1], 0.0], now
            self.long_gaps[1] = max(self.long_gaps[1], gap)
        else:
            self.period_start = now
        self.batches += 1
        self.last_arrival = now

    @property
    def cadence(self) -> float:
        """The longest interval between its batches: of its last 32, and of its pauses in the last 10-20 min."""
        return max(max(self.intervals, default=0.0), *self.long_gaps)

    def stepped(self, step: int, wall_time: float) -> None:
        if self.samples and step < self.samples[-1][0]:
            self.samples.clear()  # the run restarted from a checkpoint: its steps begin again
        self.samples.append((step, wall_time))
        self.last_step = step

    def step_time(self) -> float | None:
        """Seconds a step over the last batches (by the client's wall times); None before enough of them."""
        if len(self.samples) < 4:
            return None
        (first, start), (last, end) = self.samples[0], self.samples[-1]
        return (end - start) / (last - first) if last > first and end >= start else None


@dataclass(slots=True)
class NonFinite:
    """A tag that logged a non-finite value: where first, and each offending rank's finite points since."""

    rank: str
    step: int
    value: float
    finite: dict[str, int] = field(default_factory=dict)


Column = Sequence[Any] | NDArray[Any]


class _Batch:
    """A batch's scalars as three columns: numpy arrays (a large batch of columns), plain lists, or a message's
    repeated fields (`lazy`), each copied into a list the first time it is read: reading such a field element
    by element costs several times a list's, and a small clean batch needs only its values."""

    def __init__(self, tag_index: Column, steps: Column, values: Column, lazy: int | None = None) -> None:
        self._columns = [tag_index, steps, values]
        self._lazy = lazy  # the index of the first scalar in fields to copy from; None: the columns are ready

    def _column(self, which: int) -> Column:
        column = self._columns[which]
        if self._lazy is not None and not isinstance(column, list):
            column = self._columns[which] = column[self._lazy :]  # a slice: the fastest copy of a field
        return column

    @property
    def finite(self) -> bool:
        """Whether every value is finite: their sum is exactly then (float64 cannot overflow on float32 values)."""
        values = self._column(2)
        total = float(values.sum(dtype=np.float64)) if isinstance(values, np.ndarray) else sum(values)
        return math.isfinite(total)

    def values_of(self, which: int, tags: int) -> Values:
        """The values of tag `which` (of a table of `tags`), in order: an array of a batch of arrays, else a list
        (not to be changed: maybe the batch's own)."""
        column = self._column(2)
        if isinstance(column, np.ndarray):
            return column[self._columns[0] == which] if tags > 1 else column
        return self.value_list(which, tags)

    def value_list(self, which: int, tags: int) -> list[float]:
        """The values of tag `which`, in order, as a list."""
        return self._of(2, which, tags)

    def steps_of(self, which: int, tags: int) -> list[int]:
        """The steps of tag `which`, in order, as a list."""
        return self._of(1, which, tags)

    def _of(self, column_index: int, which: int, tags: int) -> list[Any]:
        column = self._column(column_index)
        if isinstance(column, np.ndarray):
            return (column[self._columns[0] == which] if tags > 1 else column).tolist()  # type: ignore[no-any-return]
        if tags == 1:
            return column if isinstance(column, list) else list(column)
        return [x for t, x in zip(self._column(0), column, strict=True) if t == which]

    def nonfinite_tags(self) -> set[int]:
        return {int(t) for t, v in zip(self._column(0), self._column(2), strict=True) if not math.isfinite(v)}


Outcome = tuple[dict[Key, Finding], dict[Key, str]]
"""the findings whose condition holds now, and the keys whose condition is seen to have ended (with why)"""


class RunWatch:
    """The watch of one run: fed by its workers' batches (`take`), evaluated on each tick (`evaluate`)."""

    def __init__(self, run: str, rules: Rules, series_room: Callable[[], bool], wall: Callable[[], float]) -> None:
        self.run = run
        self.rules = rules
        self.workers: dict[str, Worker] = {}
        self.series: dict[tuple[str, str], Series] = {}
        self.nonfinite: dict[str, NonFinite] = {}
        self.ended = False  # every worker it had closed its session
        self.series_refused = 0
        self._series_room = series_room
        self._wall = wall
        self._on = {rule: rules.applies(rule, run) for rule in ("silence", "nonfinite", "divergence", "straggler")}
        self._plans: dict[tuple[str, ...], list[int]] = {}  # a batch's tag table: the indices divergence watches
        self._diverging: dict[str, float] = {}  # tags whose divergence fired before a restart: their resolve level
        self._tag_rules: dict[str, tuple[bool, bool]] = {}
        self._of_tag: dict[str, list[tuple[str, Series]]] = {}  # the series of each tag, over its ranks
        self._touched: set[str] = set()  # tags whose series took points since the last tick
        self.left = False  # a worker was let go since the watch last looked (its sessions are let go too)

    # ---- on each batch -------------------------------------------------------------------------------

    def take(self, worker: Worker, events: Sequence[bytes], now: float) -> None:
        """A batch `worker` wrote (on the event loop, after the write)."""
        worker.arrived(now)
        if isinstance(events, ScalarRecords):
            columns, start = events.columns
            steps = events.steps
            if len(steps) <= start:
                return
            worker.stepped(steps[-1], columns.wall_time[-1])
            tags: Sequence[str] = events.tags
            arrays = events.arrays
            if arrays is not None and len(events) > _FEW_SCALARS:  # a large batch: its columns read to frame them
                batch = _Batch(arrays.tag_index, arrays.steps, arrays.values)
            else:  # a small one: numpy's fixed cost per call is more than Python's per point
                batch = _Batch(columns.tag_index, steps, columns.value, lazy=start)
        elif isinstance(events, EventBatch) and events.usual is not None:  # read by its check: its columns
            usual = events.usual
            worker.stepped(int(usual.steps[-1]), float(usual.wall_times[-1]))
            tags = usual.tags
            batch = _Batch(usual.tag_index, usual.steps, usual.values)
        else:
            found = event_point_columns(events)
            if not found.steps:
                return
            worker.stepped(found.steps[-1], found.wall_times[-1])
            tag_of = list(found.tags)  # each look at a message's repeated string makes its str again
            tags = list(dict.fromkeys(tag_of))
            if len(tags) == 1:  # a batch of one tag, the usual: no lookup per point
                tag_index: list[int] = [0] * len(tag_of)
            else:
                table = {tag: i for i, tag in enumerate(tags)}
                tag_index = list(map(table.__getitem__, tag_of))
            batch = _Batch(tag_index, found.steps, found.values)
        watched = self._plan(tags) if self._on["divergence"] else []
        finite = batch.finite
        if watched:
            self._diverge(worker.rank, tags, watched, batch, finite)
        if (not finite and self._on["nonfinite"]) or self.nonfinite:
            self._nonfinite(worker.rank, tags, batch, not finite)

    def _rules_of(self, tag: str) -> tuple[bool, bool]:
        """Whether divergence and the non-finite rule watch `tag` (remembered for a bounded number of tags)."""
        known = self._tag_rules.get(tag)
        if known is None:
            known = (
                any(fnmatch.fnmatchcase(tag, p) for p in self.rules.divergence.tags),
                any(fnmatch.fnmatchcase(tag, p) for p in self.rules.nonfinite.tags),
            )
            if len(self._tag_rules) < 4096:
                self._tag_rules[tag] = known
        return known

    def _plan(self, tags: Sequence[str]) -> list[int]:
        key = tuple(tags)
        plan = self._plans.get(key)
        if plan is None:
            plan = [i for i, tag in enumerate(key) if self._rules_of(tag)[0]]
            if len(self._plans) < 256:
                self._plans[key] = plan
        return plan

    def _diverge(self, rank: str, tags: Sequence[str], watched: list[int], batch: _Batch, finite: bool) -> None:
        rule = self.rules.divergence
        count = len(tags)
        for which in watched:
            values = batch.values_of(which, count)
            if not len(values):
                continue
            tag = tags[which]
            key = (rank, tag)
            series = self.series.get(key)
            if series is None:
                if not self._series_room():
                    self.series_refused += len(values)
                    continue
                series = self.series[key] = Series(rule.window)
                self._of_tag.setdefault(tag, []).append((rank, series))
                level = self._diverging.get(tag)
                if level is not None:  # fired before a restart: it fires on until it comes back under its level
                    series.firing, series.resolve_below = True, level
            series.add(values, functools.partial(batch.steps_of, which, count), rule, clean=finite)
            self._touched.add(tag)

    def _nonfinite(self, rank: str, tags: Sequence[str], batch: _Batch, bad: bool) -> None:
        which = batch.nonfinite_tags() if bad else set()
        which.update(i for i, tag in enumerate(tags) if tag in self.nonfinite)
        resolve = self.rules.nonfinite.resolve_points
        for i in which:
            tag = tags[i]
            if not self._rules_of(tag)[1]:
                continue
            state = self.nonfinite.get(tag)
            for step, value in zip(batch.steps_of(i, len(tags)), batch.value_list(i, len(tags)), strict=True):
                if math.isfinite(value):
                    if state is not None and rank in state.finite and state.finite[rank] < resolve:
                        state.finite[rank] += 1
                    continue
                if state is None:
                    if len(self.nonfinite) >= self.rules.max_nonfinite_tags:  # findings a run stay bounded
                        self.series_refused += 1
                        continue
                    state = self.nonfinite[tag] = NonFinite(rank, step, value)
                state.finite[rank] = 0

    # ---- on each tick --------------------------------------------------------------------------------

    def restore(self, finding: Finding) -> None:
        """Take up a finding that fired before a restart, so that its condition is evaluated from where it was."""
        if finding.rule == "nonfinite":
            self.nonfinite.setdefault(finding.subject, NonFinite(finding.rank, finding.step, finding.value)).finite[
                finding.rank
            ] = 0
        elif finding.rule == "divergence":
            self._diverging[finding.subject] = finding.detail

    def evaluate(self, now: float, workers: bool = True) -> Outcome:
        """Which findings of the run hold now and which are seen to have ended; with `workers`, the rules over
        every worker too (sessions ending, silence, stragglers), else only those over what took points."""
        holds: dict[Key, Finding] = {}
        ended: dict[Key, str] = {}
        if workers:
            self._workers_ending(now)
            if self._on["silence"]:
                self._silence(now, holds, ended)
            if self._on["straggler"]:
                self._stragglers(now, holds, ended)
        if self._on["divergence"]:
            self._divergence(holds, ended)
        if self._on["nonfinite"]:
            self._nonfinites(holds, ended)
        return holds, ended

    def _finding(self, rule: str, subject: str, rank: str, step: int, value: float, summary: str) -> Finding:
        return Finding(rule, self.run, subject, rank, step, value, summary, self._wall())

    def _workers_ending(self, now: float) -> None:
        lost = self.rules.silence.lost_secs
        gone: list[str] = []
        closed = False
        for rank, worker in self.workers.items():
            session = worker.session
            ending = session.ending if session is not None else "released"
            if ending is None:  # the common case: an open session
                continue
            if ending == "closed":
                gone.append(rank)
                closed = True
            elif ending == "released":
                if worker.released_at is None:
                    worker.released_at = now
                elif now - worker.released_at > lost:
                    gone.append(rank)  # lost long ago: no longer watched
        if gone:
            for rank in gone:
                del self.workers[rank]
            self.ended = closed and not self.workers
            self.left = True

    def _silence(self, now: float, holds: dict[Key, Finding], ended: dict[Key, str]) -> None:
        rule = self.rules.silence
        key: Key = ("silence", self.run, "")
        silent: list[tuple[float, Worker]] = []
        # The grace keeps a late batch from being taken for a hang; once one worker is past it, those quiet past
        # their own rhythm (`factor` times their cadence) have stopped too. A hang in a collective stops every rank
        # at once, but their thresholds differ by their cadences and are looked at once a second: the finding
        # names them all from its first message, not one rank of three.
        stopped = 0
        for worker in self.workers.values():
            if worker.batches < rule.min_batches:
                continue
            rhythm = rule.factor * worker.cadence
            worker.silent_after = rule.after_secs or rhythm + rule.grace_secs
            quiet = now - worker.last_arrival
            if quiet > worker.silent_after:
                silent.append((quiet, worker))
            if quiet > min(rhythm, worker.silent_after):
                stopped += 1
        if silent:
            quiet, worker = max(silent, key=lambda s: s[0])
            state = "open" if worker.released_at is None else "lost (released by the daemon)"
            holds[key] = self._finding(
                "silence",
                "",
                worker.rank,
                worker.last_step,
                quiet,
                f"{_name(worker.rank)} has logged nothing for {quiet:.1f}s (silent after {worker.silent_after:.1f}s), "
                f"last at step {worker.last_step}; {stopped} of {len(self.workers)} workers silent; its session "
                f"is {state}",
            )
        elif self.workers:
            ended[key] = "every worker logs again"
        elif self.ended:
            ended[key] = "the run's sessions closed"

    def _stragglers(self, now: float, holds: dict[Key, Finding], ended: dict[Key, str]) -> None:
        rule = self.rules.straggler
        times = {
            rank: t
            for rank, worker in self.workers.items()
            if now - worker.last_arrival <= worker.silent_after and (t := worker.step_time()) is not None and t > 0
        }
        if len(times) < rule.min_workers:
            return
        furthest = max((w.last_step for w in self.workers.values()), default=0)
        ordered = sorted(times.values())  # once per tick: each rank's "others" are this less one
        for rank, worker in self.workers.items():
            key: Key = ("straggler", self.run, rank)
            mine = times.get(rank)
            if mine is None:
                continue
            typical = _median_without(ordered, bisect.bisect_left(ordered, mine))
            ratio = mine / typical
            if ratio >= rule.factor:
                worker.fast_since = None
                worker.slow_since = worker.slow_since if worker.slow_since is not None else now
                if now - worker.slow_since >= rule.for_secs:
                    holds[key] = self._finding(
                        "straggler",
                        rank,
                        rank,
                        worker.last_step,
                        ratio,
                        f"{_name(rank)} takes {mine:.3g}s a step, {ratio:.1f}x the median of the other ranks "
                        f"({typical:.3g}s); {furthest - worker.last_step} steps behind the furthest rank",
                    )
            elif ratio < rule.resolve_factor:
                worker.slow_since = None
                worker.fast_since = worker.fast_since if worker.fast_since is not None else now
                if now - worker.fast_since >= rule.for_secs:
                    ended[key] = f"{_name(rank)} keeps pace again ({ratio:.2f}x the median)"
            else:  # between the two: neither starts nor ends a finding
                worker.slow_since = worker.fast_since = None

    def _divergence(self, holds: dict[Key, Finding], ended: dict[Key, str]) -> None:
        rule = self.rules.divergence
        touched, self._touched = self._touched, set()
        for tag in touched:
            of_tag = self._of_tag[tag]
            for _, series in of_tag:
                if series.dirty:
                    series.rebase(rule)
            key: Key = ("divergence", self.run, tag)
            firing = [(rank, s) for rank, s in of_tag if s.firing]
            if not firing:
                ended[key] = f"{tag} is back under its level on every rank"
                self._diverging.pop(tag, None)
                continue
            rank, series = firing[0]
            step, value = series.first
            holds[key] = replace(
                self._finding(
                    "divergence",
                    tag,
                    rank,
                    step,
                    value,
                    f"{tag} on {_name(rank)} rose to {value:.4g} at step {step}, above {series.threshold:.4g} (its "
                    f"recent minimum x{rule.ratio:g} or median + {rule.spike_mads:g} MADs) for {rule.for_points} "
                    f"points; {len(firing)} of {len(of_tag)} ranks",
                ),
                detail=series.resolve_below,
            )

    def _nonfinites(self, holds: dict[Key, Finding], ended: dict[Key, str]) -> None:
        resolve = self.rules.nonfinite.resolve_points
        for tag, state in list(self.nonfinite.items()):
            key: Key = ("nonfinite", self.run, tag)
            offending = [rank for rank, count in state.finite.items() if count < resolve]
            if offending:
                holds[key] = self._finding(
                    "nonfinite",
                    tag,
                    state.rank,
                    state.step,
                    state.value,
                    f"{tag} is {state.value} on {_name(state.rank)} at step {state.step}"
                    + (f"; {len(offending)} ranks not finite since" if len(offending) > 1 else ""),
                )
            else:
                ended[key] = f"{tag} is finite again on every rank ({resolve} points)"
                del self.nonfinite[tag]

    @property
    def step(self) -> int:
        """The furthest step of its workers (0 without any)."""
        return max((w.last_step for w in self.workers.values()), default=0)


def _median_without(ordered: list[float], index: int) -> float:
    """The median of sorted `ordered` less its element at `index` (in O(1): the others keep their order)."""
    count = len(ordered) - 1

    def at(j: int) -> float:
        return ordered[j if j < index else j + 1]

    middle = count // 2
    return at(middle) if count % 2 else (at(middle - 1) + at(middle)) / 2


def _name(rank: str) -> str:
    return rank or "the writer"
