"""Pending steps of one aggregated run: each scalar tag's points by step, with one value per worker.

A step of a tag is finalised once every worker of the world is past it or at it, after the straggler timeout
with the workers that reported it, when the pending bound is reached (the oldest first), or when the run's last
session leaves; it becomes a `Reduction` once two workers have ever reported the tag. A tag's steps are
finalised in ascending order, and a point at or below a tag's last finalised step is not taken: an aggregate
once written is never written again.

Only completion finalises a step beyond the run's frontier (the second-furthest worker's position, see
`StepTable.frontier`): the timeout holds such a step until another worker gets there, the pending bound and
the run's end drop it (counted in `dropped_steps`), so that one point far ahead (a step of 10^12 among steps in
the hundreds) never makes every later step late. At most `max_tags` tags are held; the points of further tags
are counted in `refused_points` and not aggregated (they are in their worker's own run all the same).

Nothing here does I/O or keeps time itself; the caller passes the clock. The state is numpy arrays by worker
slot (each tag's workers' positions, each pending step's values): many batches taken together cost a few array
operations per tag and step (`add_columns`), a few batches a few operations per point (`add_all`); completion is
checked once per call of `complete` for each tag touched since.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray


def every_tag(_: str) -> bool:
    """The filter that takes every tag (`StepTable.add_all` knows it, and calls it for no tag)."""
    return True


_Item = TypeVar("_Item", bound=np.generic)

# A batch's tag not aggregated, one beyond `max_tags`, and one it does not use (`StepTable._tag_ids`).
_UNWANTED, _REFUSED, _UNSEEN = -1, -2, -3
_MAX_TABLES = 8_192  # tag tables remembered per run (one per rank, typically): beyond, forgotten at once


@dataclass(frozen=True)
class ColumnBatch:
    """One batch's points as columns, for `StepTable.add_columns`: the points of tags `wanted` are taken."""

    worker: str
    tags: Sequence[str]
    tag_index: NDArray[np.int64]
    steps: NDArray[np.int64]
    wall_times: NDArray[np.float64]
    values: NDArray[np.floating[Any]]
    wanted: Callable[[str], bool] = every_tag


@dataclass(frozen=True)
class Reduction:
    """One finalised step of a tag: its reductions over the workers that reported it."""

    tag: str
    step: int
    wall_time: float
    count: int
    mean: float
    min: float
    max: float
    std: float


def reduce(tag: str, step: int, wall_time: float, values: Iterable[float]) -> Reduction:
    """The reductions of `values`: mean, min, max and the population standard deviation, the same whatever the
    values' order and never raising.

    With a NaN among the values all four are NaN. Otherwise min and max are the ordinary ones (-0.0 below 0.0);
    with an infinity among the values the mean is that infinity (NaN when both signs are there, as IEEE has
    inf + -inf) and the std NaN (as numpy has it). Finite values are scaled by a power of two (exact) so that
    neither sum can overflow or lose subnormals; both sums are `math.fsum` (correctly rounded, so independent of
    the order); the mean is kept within [min, max] and the std within [0, (max - min) / 2].
    """
    points = list(values)
    count = len(points)
    try:
        total = math.fsum(points)
    except (ValueError, OverflowError):  # inf + -inf, or a finite sum beyond float64
        total = math.nan
    if math.isfinite(total):  # the common case: no NaN nor infinity (either would show), nothing to scale
        low, high = min(points), max(points)
        if low == 0 or high == 0:
            low, high = _signed_min(points), _signed_max(points)
        if _UNSCALED_LOW <= max(-low, high) <= _UNSCALED_HIGH:
            mean = total / count
            std = math.sqrt(_sum_of_squares(points, mean) / count)
            mean, std = min(max(mean, low), high) + 0.0, min(std, high / 2 - low / 2)
            return Reduction(tag, step, wall_time, count, mean, low, high, std)
    if any(map(math.isnan, points)):
        return Reduction(tag, step, wall_time, count, math.nan, math.nan, math.nan, math.nan)
    low, high = min(points), max(points)
    if low == 0 or high == 0:
        low, high = _signed_min(points), _signed_max(points)
    if math.isinf(low) or math.isinf(high):
        mean = math.nan if low == -high else (high if math.isinf(high) else low)
        return Reduction(tag, step, wall_time, count, mean, low, high, math.nan)
    largest = max(-low, high)
    if largest == 0 or _UNSCALED_LOW <= largest <= _UNSCALED_HIGH:
        shift, scaled = 0, points  # scaling would change no bit
    else:
        shift = math.frexp(largest)[1]  # every scaled value is within (-1, 1)
        scaled = [math.ldexp(v, -shift) for v in points]
    scaled_mean = math.fsum(scaled) / count
    spread = math.sqrt(math.fsum([(v - scaled_mean) ** 2 for v in scaled]) / count)
    if shift:
        scaled_mean, spread = _unscaled(scaled_mean, shift), _unscaled(spread, shift)
    mean = min(max(scaled_mean, low), high) + 0.0  # + 0.0: no -0.0 from one order only
    std = min(spread, high / 2 - low / 2)
    return Reduction(tag, step, wall_time, count, mean, low, high, std)


def _sum_of_squares(points: list[float], mean: float) -> float:
    """The correctly rounded sum of the squared deviations from `mean`: each square taken by numpy for many
    points (the same IEEE operations as Python's, a tenth of the cost), summed by `math.fsum`."""
    if len(points) < _SQUARES_BY_NUMPY:
        return math.fsum([(v - mean) ** 2 for v in points])
    deviations = np.array(points, dtype=np.float64) - mean
    return math.fsum((deviations * deviations).tolist())


_SQUARES_BY_NUMPY = 64  # points from which `_sum_of_squares` squares with numpy

# Magnitudes whose sums of squares neither overflow nor reach subnormals: computed as they are.
_UNSCALED_LOW, _UNSCALED_HIGH = 2.0**-400, 2.0**400


def _unscaled(x: float, shift: int) -> float:
    try:
        return math.ldexp(x, shift)
    except OverflowError:  # only at the very edge of the range: the clamp that follows decides
        return math.copysign(math.inf, x)


def _signed_min(points: list[float]) -> float:
    low = min(points)
    return -0.0 if low == 0 and any(math.copysign(1.0, v) < 0 for v in points if v == 0) else low


def _signed_max(points: list[float]) -> float:
    high = max(points)
    return 0.0 if high == 0 and any(math.copysign(1.0, v) > 0 for v in points if v == 0) else high


@dataclass
class _Step:
    wall_time: float
    # Each worker's value (by its slot, `StepTable._slot`) where `given`: arrays, so that a step of a thousand
    # ranks takes their values in two numpy assignments, not a thousand dict entries.
    values: NDArray[np.float64]
    given: NDArray[np.bool_]
    # The same arrays' memory as memoryviews, for `add_all`'s point by point: an element read or written through
    # one costs half what numpy's indexing does (no scalar object, no index parsing). Made again when widened.
    value_view: Any = field(init=False, repr=False)  # a memoryview (typed for bytes' ints only: it takes floats)
    given_view: memoryview = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.value_view, self.given_view = self.values.data, self.given.data

    @classmethod
    def opened(cls, wall_time: float, width: int) -> _Step:
        """A step no worker gave a value of yet, with room for `width` workers."""
        return cls(wall_time, np.zeros(width, dtype=np.float64), np.zeros(width, dtype=np.bool_))

    def fit(self, width: int) -> None:
        """Room for `width` workers."""
        if len(self.given) < width:
            self.values, self.given = _wider(self.values, width), _wider(self.given, width)
            self.value_view, self.given_view = self.values.data, self.given.data


@dataclass
class _Tag:
    name: str
    index: int  # in `StepTable._states`
    # Each worker's latest step of this tag (the step of its last point, not the largest: a restart lowers it),
    # by slot, where `reported`.
    latest: NDArray[np.int64]
    reported: NDArray[np.bool_]
    count: int = 0  # of workers reported
    pending: dict[int, _Step] = field(default_factory=dict)
    last_final: int | None = None
    # Whether two workers ever reported the tag: a tag only one worker logs (frameworks log from rank 0 only)
    # has nothing to reduce, and its steps are finalised without a reduction.
    shared: bool = False
    # The watermark (`StepTable._watermark`) as last computed, and how many live workers stand at it: kept as
    # points arrive, so that it is computed again only when the last worker at it moves on (once a step), not
    # for every batch (over every worker: a cost of N per batch, N² per step for a job of N ranks).
    mark: int | None = None
    at_mark: int = 0
    mark_known: bool = False
    # `latest` and `reported` as memoryviews, for `add_all` (as `_Step.value_view`).
    latest_view: memoryview = field(init=False, repr=False)
    reported_view: memoryview = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.latest_view, self.reported_view = self.latest.data, self.reported.data

    def fit(self, width: int) -> None:
        """Room for `width` workers."""
        if len(self.reported) < width:
            self.latest, self.reported = _wider(self.latest, width), _wider(self.reported, width)
            self.latest_view, self.reported_view = self.latest.data, self.reported.data


def _wider(array: NDArray[_Item], size: int) -> NDArray[_Item]:
    """`array` with room for `size` slots (the new ones zero: not given, not reported)."""
    if len(array) >= size:
        return array
    grown = np.zeros(max(size, 2 * len(array)), dtype=array.dtype)
    grown[: len(array)] = array
    return grown


def _changes(column: NDArray[np.int64]) -> NDArray[np.bool_]:
    """Where a sorted column's value differs from the one before (the first: always)."""
    changed = np.empty(column.size, dtype=np.bool_)
    changed[:1] = True
    np.not_equal(column[1:], column[:-1], out=changed[1:])
    return changed


def _run_ends(starts: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """Where a run ends, given where runs start (`_changes`): the element before each start, and the last."""
    ends = np.empty(starts.size, dtype=np.bool_)
    ends[-1:] = True
    ends[:-1] = starts[1:]
    return ends


class StepTable:
    """The pending steps of one run's tags, and which workers stand where."""

    def __init__(
        self,
        world_size: int,
        max_pending: int,
        last_final: Mapping[str, int] | None = None,
        max_tags: int = 10_000,
    ) -> None:
        self.world_size = world_size
        self.max_pending = max_pending
        self.max_tags = max_tags
        self._tags: dict[str, _Tag] = {}
        self._states: list[_Tag] = []  # the same states, by index (`add_columns`)
        # Tag tables of batches, with their filter: each tag's state index (`_tag_ids`).
        self._tables: dict[tuple[Callable[[str], bool], tuple[str, ...]], NDArray[np.int64]] = {}
        # Each tag's last step read back from the aggregate runs, taken into its state when the tag is next met.
        self._written: dict[str, int] = dict(last_final or {})
        # Pending steps in the order they were opened (entries of steps finalised since are skipped when met).
        self._arrivals: deque[tuple[float, str, int]] = deque()
        # Overdue steps beyond the frontier, lowest first: finalised once the frontier reaches them.
        self._held: list[tuple[int, str]] = []
        self._pending = 0
        self._touched: set[str] = set()
        self._departed: set[str] = set()
        # Each worker's slot in the tags' and steps' arrays, in the order they were first met.
        self._slots: dict[str, int] = {}
        # Each worker's progress: the step of its last point of any tag.
        self.progress: dict[str, int] = {}
        self.late_points = 0
        self.refused_points = 0  # points of tags beyond `max_tags`
        self.refused_tag = ""  # the last such tag
        self.dropped_steps = 0  # pending steps beyond the frontier let go of, never written
        self.held_steps = 0  # overdue steps held because they were beyond the frontier

    def __len__(self) -> int:
        """Pending steps over all tags."""
        return self._pending

    @property
    def tag_count(self) -> int:
        """The tags whose state is held (at most `max_tags`)."""
        return len(self._tags)

    # ---- the world -------------------------------------------------------------------------------------

    def joined(self, worker: str, world_size: int) -> None:
        """A session of `worker` opened (anew, or after a restart: where it stood is forgotten until it reports)."""
        self.world_size = max(self.world_size, world_size)
        self._departed.discard(worker)
        slot = self._slot(worker)
        for state in self._tags.values():
            if slot < len(state.reported) and state.reported[slot]:
                state.reported[slot] = False
                state.count -= 1
            state.mark_known = False

    def departed(self, worker: str) -> None:
        """`worker` has no session left: steps no longer wait for it."""
        self._departed.add(worker)
        self._touched.update(self._tags)
        for state in self._tags.values():
            state.mark_known = False

    def world_left(self) -> bool:
        """Whether every worker of the world has left (the job ended)."""
        return len(self._departed) >= self.world_size

    def lag(self) -> dict[str, int]:
        """Per worker, how many steps it is behind the furthest one."""
        if not self.progress:
            return {}
        leader = max(self.progress.values())
        return {worker: leader - step for worker, step in self.progress.items()}

    def frontier(self) -> int | None:
        """The furthest step that a worker other than the furthest one stands at (the furthest worker's own
        position while only one has reported; None before any): no step beyond it is finalised but by
        completion, so that one worker's point far ahead of the others cannot make their later steps late.
        A worker with no session left (lost or released, as a hung one is after the session lease) holds no one
        back: it counts as standing with the furthest."""
        progress, departed = self.progress, self._departed
        positions: Collection[int] = progress.values()
        if departed and progress:
            leader = max(positions)
            positions = [leader if worker in departed else step for worker, step in progress.items()]
        if len(positions) < 2:
            return max(positions, default=None)
        first = second = None
        for step in positions:
            if first is None or step > first:
                first, second = step, first
            elif second is None or step > second:
                second = step
        return second

    # ---- points ----------------------------------------------------------------------------------------

    def add(self, worker: str, tag: str, step: int, wall_time: float, value: float, now: float) -> None:
        """Take one point of `worker` (see `add_all`)."""
        self.add_all(worker, [(tag, step, wall_time, value)], every_tag, now)

    def add_all(
        self, worker: str, points: Iterable[tuple[str, int, float, float]], wanted: Callable[[str], bool], now: float
    ) -> None:
        """Take the points (tag, step, wall time, value) of one batch of `worker` whose tag is `wanted`. A later
        value of the same worker and step replaces the earlier one. Point by point, for a few batches (numpy's
        fixed costs per call are more than a few dozen points cost here; many go to `add_columns`): a batch's
        points come in runs of one tag, so the tag's state is looked up once per run. The arrays are read and
        written through their memoryviews (`_Tag.latest_view`, `_Step.value_view`): numpy's indexing of one
        element costs twice as much."""
        tags, arrivals, touched = self._tags, self._arrivals, self._touched
        slot = self._slot(worker)
        width = len(self._slots)
        state: _Tag | None = None
        latest: memoryview | None = None
        reported: memoryview | None = None
        current, skip, last = None, False, None
        every = wanted is every_tag  # then no call per tag
        if worker in self._departed:  # not while its session lives; but then no kept watermark may count it
            for known in tags.values():
                known.mark_known = False
        for tag, step, wall_time, value in points:
            if tag != current:
                current, skip = tag, not (every or wanted(tag))
                if skip:
                    continue
                state = tags.get(tag) or self._new_tag(tag)
                if state is None:
                    skip = True
                    self.refused_points += 1
                    last = step
                    continue
                if len(state.reported) < width:  # (`fit` tells the same; a call per point costs more)
                    state.fit(width)
                latest, reported = state.latest_view, state.reported_view
                touched.add(tag)
            elif skip:
                if tag not in tags and wanted(tag):
                    self.refused_points += 1
                    last = step
                continue
            assert state is not None and latest is not None and reported is not None
            old = latest[slot] if reported[slot] else None
            if old != step:
                latest[slot] = step
                if old is None:
                    reported[slot] = True
                    state.count += 1
                if state.mark_known:
                    mark = state.mark
                    if old is None or mark is None or step < mark:
                        state.mark_known = False
                    elif old == mark:
                        state.at_mark -= 1
                        state.mark_known = state.at_mark > 0
                    elif step == mark:
                        state.at_mark += 1
            last = step
            if state.last_final is not None and step <= state.last_final:
                self.late_points += 1
                continue
            pending = state.pending.get(step)
            if pending is None:
                pending = state.pending[step] = _Step.opened(wall_time, width)
                arrivals.append((now, tag, step))
                self._pending += 1
            else:
                pending.wall_time = max(pending.wall_time, wall_time)
                if len(pending.given) < width:
                    pending.fit(width)
            pending.value_view[slot] = value
            pending.given_view[slot] = True
        if last is not None:
            self.progress[worker] = last

    def add_columns(self, batches: Sequence[ColumnBatch], now: float) -> None:
        """Take the points of many batches at once, in order, as `add_all` of each would: the path of a group
        commit's batches, many ranks' steps of the same tags. The points are sorted by tag, step and worker
        (numpy), and each tag takes its workers' positions, and each (tag, step) its workers' values, in a few
        array assignments: the Python work is per tag and step of the batches, not per point."""
        batches = [batch for batch in batches if len(batch.steps)]
        if not batches:
            return
        workers = [batch.worker for batch in batches]
        sizes = np.array([len(batch.steps) for batch in batches], dtype=np.int64)
        local = np.concatenate([batch.tag_index for batch in batches])
        if local.min() < 0 or (local >= np.repeat([len(batch.tags) for batch in batches], sizes)).any():
            raise ValueError("a batch's tag index is beyond its tags")
        tables = [self._tag_ids(batch.wanted, batch.tags, batch.tag_index) for batch in batches]
        bases = np.cumsum([0, *map(len, tables[:-1])])
        tag = np.concatenate(tables)[local + np.repeat(bases, sizes)]
        steps = np.concatenate([batch.steps for batch in batches])
        # A worker's progress: the step of its batch's last point of a tag it aggregates (refused ones included).
        firsts = np.cumsum(sizes) - sizes
        last = np.maximum.reduceat(np.where(tag != _UNWANTED, np.arange(tag.size), -1), firsts)
        moved = np.flatnonzero(last >= 0)
        if moved.size:
            movers = map(workers.__getitem__, moved.tolist())
            self.progress.update(zip(movers, steps[last[moved]].tolist(), strict=True))
        if self._departed and not self._departed.isdisjoint(workers):
            for known in self._tags.values():  # as in add_all: no kept watermark may count a departed worker
                known.mark_known = False
        refused = int(np.count_nonzero(tag == _REFUSED))
        self.refused_points += refused
        kept = np.flatnonzero(tag >= 0)
        if not kept.size:
            return
        slots = np.array([self._slot(worker) for worker in workers], dtype=np.int64)
        tag, steps, slot = tag[kept], steps[kept], np.repeat(slots, sizes)[kept]
        width = len(self._slots)
        states = self._states
        # Where each worker stands in each tag: the step of its last point of it (the sort is stable).
        by_tag = np.lexsort((slot, tag))
        last = by_tag[_run_ends(_changes(tag[by_tag]) | _changes(slot[by_tag]))]
        stood_tag = tag[last]
        starts = np.flatnonzero(_changes(stood_tag)).tolist()
        for first, stop in zip(starts, [*starts[1:], stood_tag.size], strict=True):
            state = states[int(stood_tag[first])]
            self._stand(state, slot[last[first:stop]], steps[last[first:stop]], width)
            self._touched.add(state.name)
        # Each (tag, step)'s points: each worker's last value of it, the step's latest wall time, and which of
        # its points came first (the steps opened are queued in that order, the oldest first).
        order = np.lexsort((slot, steps, tag))
        tag, steps, slot = tag[order], steps[order], slot[order]
        groups = _changes(tag) | _changes(steps)
        group_starts = np.flatnonzero(groups)
        picked = kept[order]  # each sorted point's index among the batches' points
        wall_times = np.maximum.reduceat(np.concatenate([b.wall_times for b in batches])[picked], group_starts)
        arrived = np.minimum.reduceat(order, group_starts)
        given = _run_ends(groups | _changes(slot))  # a worker's last point of each (tag, step)
        values = np.concatenate([batch.values for batch in batches])[picked[given]].astype(np.float64)
        given_slots = slot[given]
        # Where each group's given points end: they are in group order.
        given_ends = np.searchsorted(np.cumsum(groups)[given], np.arange(1, group_starts.size + 1), side="right")
        opened: list[tuple[int, str, int]] = []  # steps opened: (their first point, tag, step)
        group_list = group_starts.tolist()
        given_list = given_ends.tolist()
        for first, stop, begin, end, step, which, wall_time, came in zip(
            group_list,
            [*group_list[1:], tag.size],
            [0, *given_list[:-1]],
            given_list,
            steps[group_starts].tolist(),
            tag[group_starts].tolist(),
            wall_times.tolist(),
            arrived.tolist(),
            strict=True,
        ):
            state = states[which]
            if state.last_final is not None and step <= state.last_final:
                self.late_points += stop - first
                continue
            pending = state.pending.get(step)
            if pending is None:
                pending = state.pending[step] = _Step.opened(wall_time, width)
                opened.append((came, state.name, step))
            else:
                pending.wall_time = max(pending.wall_time, wall_time)
                pending.fit(width)
            which_slots = given_slots[begin:end]
            pending.values[which_slots] = values[begin:end]
            pending.given[which_slots] = True
        # Queued in the order their first points came: the oldest goes first.
        opened.sort()
        self._arrivals.extend((now, tag_name, step) for _, tag_name, step in opened)
        self._pending += len(opened)

    @staticmethod
    def _stand(state: _Tag, slots: NDArray[np.int64], steps: NDArray[np.int64], width: int) -> None:
        """Where the workers of `slots` now stand in the tag (each one once), its kept watermark kept true."""
        state.fit(width)
        latest, reported = state.latest, state.reported
        mark = state.mark
        first = len(slots) - int(np.count_nonzero(reported[slots]))  # workers reporting the tag for the first time
        state.count += first
        if state.mark_known:
            # Kept while every worker stays at or past it and one still stands at it; a first point (one not
            # reported) or one below it makes it computed again.
            if mark is None or first or int(steps.min()) < mark:
                state.mark_known = False
            else:
                state.at_mark += int(np.count_nonzero(steps == mark)) - int(np.count_nonzero(latest[slots] == mark))
                state.mark_known = state.at_mark > 0
        latest[slots] = steps
        reported[slots] = True

    def _slot(self, worker: str) -> int:
        """`worker`'s slot in the arrays (a new worker gets the next one)."""
        slot = self._slots.get(worker)
        if slot is None:
            slot = self._slots[worker] = len(self._slots)
        return slot

    def _tag_ids(
        self, wanted: Callable[[str], bool], tags: Sequence[str], tag_index: NDArray[np.int64]
    ) -> NDArray[np.int64]:
        """The state index of each of a batch's tags (`_UNWANTED` when not `wanted`, `_REFUSED` beyond
        `max_tags`), remembered per tag table and filter: a rank sends the same tags in every batch. Tags new to
        the table get their states in the order the batch first uses them, as `add_all` gives them."""
        key = (wanted, tuple(tags))
        found = self._tables.get(key)
        if found is not None:
            return found
        ids = np.full(len(tags), _UNSEEN, dtype=np.int64)
        for which in dict.fromkeys(tag_index.tolist()):
            tag = key[1][which]
            if not wanted(tag):
                ids[which] = _UNWANTED
                continue
            state = self._tags.get(tag) or self._new_tag(tag)
            ids[which] = _REFUSED if state is None else state.index
        complete = True
        for which in np.flatnonzero(ids == _UNSEEN).tolist():  # tags of the table this batch does not use
            tag = key[1][which]
            state = self._tags.get(tag)
            if not wanted(tag):
                ids[which] = _UNWANTED
            elif state is not None:
                ids[which] = state.index
            else:  # its state is made when a batch uses it: this table is not kept
                complete = False
        if complete:
            if len(self._tables) >= _MAX_TABLES:
                self._tables.clear()
            self._tables[key] = ids
        return ids

    def _new_tag(self, tag: str) -> _Tag | None:
        """The state of a tag met for the first time, or None when `max_tags` are held already."""
        if len(self._tags) >= self.max_tags:
            self.refused_tag = tag
            return None
        width = len(self._slots)
        state = self._tags[tag] = _Tag(
            tag,
            len(self._states),
            np.zeros(width, dtype=np.int64),
            np.zeros(width, dtype=np.bool_),
            last_final=self._written.pop(tag, None),
        )
        self._states.append(state)
        return state

    # ---- finalising ------------------------------------------------------------------------------------

    def complete(self) -> list[Reduction]:
        """Finalise every step that all workers are at or past, of the tags touched since the last call; then,
        beyond the pending bound, the oldest steps (those beyond the frontier are dropped)."""
        done: list[Reduction] = []
        touched, self._touched = self._touched, set()
        frontier: int | None = None
        tags = self._tags
        for tag in touched:
            state = tags[tag]
            if not state.pending:
                continue
            through = state.mark if state.mark_known else self._watermark(state)  # the kept one: no call
            if through is None and self._every_worker_left(state):
                frontier = self.frontier() if frontier is None else frontier
                through = frontier
            # Most batches move no tag's watermark: a look at the lowest pending step, not a sort of them all.
            if through is not None and min(state.pending) <= through:
                done += self._finalise(tag, state, through)
        if self._pending > self.max_pending:
            frontier = self.frontier()
            while self._pending > self.max_pending:
                head = self._next_to_evict()
                if head is None:
                    break
                done += self._evict(head[0], head[1], frontier)
        return done

    def overdue(self, now: float, straggler_secs: float) -> list[Reduction]:
        """Finalise, with the workers that reported them, the steps pending for longer than `straggler_secs`
        (and each such tag's earlier steps with them), up to the frontier; an overdue step beyond it is held
        until the frontier gets there."""
        done: list[Reduction] = []
        frontier = self.frontier()
        held, tags = self._held, self._tags
        while held and frontier is not None and held[0][0] <= frontier:
            step, tag = heapq.heappop(held)
            state = tags.get(tag)
            if state is not None and step in state.pending:
                done += self._finalise(tag, state, step)
        while (head := self._oldest()) is not None and now - head[0] >= straggler_secs:
            _, tag, step = self._arrivals.popleft()
            if frontier is not None and step <= frontier:
                done += self._finalise(tag, tags[tag], step)
            else:
                heapq.heappush(held, (step, tag))
                self.held_steps += 1
        if len(held) > 2 * self._pending + 64:  # entries of steps finalised or dropped since
            self._held = [(step, tag) for step, tag in held if tag in tags and step in tags[tag].pending]
            heapq.heapify(self._held)
        return done

    def drain(self) -> list[Reduction]:
        """Finalise everything pending up to the frontier and drop the rest (the run's last session left, or the
        daemon stops)."""
        done: list[Reduction] = []
        frontier = self.frontier()
        for tag, state in self._tags.items():
            if state.pending:
                if frontier is not None:
                    done += self._finalise(tag, state, frontier)
                self.dropped_steps += len(state.pending)
                self._pending -= len(state.pending)
                state.pending.clear()
        self._arrivals.clear()
        self._held.clear()
        return done

    def _world_covered(self, state: _Tag) -> tuple[bool, NDArray[np.bool_]]:
        """Whether the workers that reported the tag and those with no session left make the whole world, and
        which of the tag's slots are those departed (a departed worker beyond them counts all the same)."""
        width = len(state.reported)
        departed = np.zeros(width, dtype=np.bool_)
        departed[[self._slots[worker] for worker in self._departed if self._slots.get(worker, width) < width]] = True
        beyond = len(self._departed) - int(np.count_nonzero(departed))
        return int(np.count_nonzero(state.reported | departed)) + beyond >= self.world_size, departed

    def _every_worker_left(self, state: _Tag) -> bool:
        if not self._departed:
            return False
        covered, departed = self._world_covered(state)
        return covered and not (state.reported & ~departed).any()

    def _watermark(self, state: _Tag) -> int | None:
        """The step every worker of the world is at or past, or None while some worker of it has not reported
        (or every worker that reported has left: then the frontier decides)."""
        if state.mark_known:
            return state.mark
        if state.count + len(self._departed) < self.world_size:
            return None  # not kept (as below), and known without a look at every worker
        covered, departed = self._world_covered(state)
        if not covered:
            return None  # not kept: the next worker to report a first point may complete the world
        active = state.latest[state.reported & ~departed]
        if not active.size:
            return None
        state.mark = mark = int(active.min())
        state.at_mark = int(np.count_nonzero(active == mark))
        state.mark_known = True
        return mark

    def _oldest(self) -> tuple[float, str, int] | None:
        """The oldest pending step's arrival entry, having dropped the entries of steps finalised since."""
        arrivals = self._arrivals
        while arrivals:
            _, tag, step = arrivals[0]
            state = self._tags.get(tag)
            if state is not None and step in state.pending:
                return arrivals[0]
            arrivals.popleft()
        return None

    def _next_to_evict(self) -> tuple[str, int] | None:
        """The oldest pending step (the held ones after every other), taken off its queue."""
        if self._oldest() is not None:
            _, tag, step = self._arrivals.popleft()
            return tag, step
        while self._held:
            step, tag = heapq.heappop(self._held)
            state = self._tags.get(tag)
            if state is not None and step in state.pending:
                return tag, step
        return None

    def _evict(self, tag: str, step: int, frontier: int | None) -> list[Reduction]:
        """Finalise a tag through `step` when it is within the frontier; drop the step otherwise."""
        state = self._tags[tag]
        if frontier is not None and step <= frontier:
            return self._finalise(tag, state, step)
        del state.pending[step]
        self._pending -= 1
        self.dropped_steps += 1
        return []

    def _finalise(self, tag: str, state: _Tag, through: int) -> list[Reduction]:
        steps = sorted(step for step in state.pending if step <= through)
        done = []
        for step in steps:
            pending = state.pending.pop(step)
            given = pending.values[pending.given]
            state.shared = state.shared or given.size > 1 or state.count > 1
            if state.shared:
                done.append(reduce(tag, step, pending.wall_time, given.tolist()))
        self._pending -= len(steps)
        if steps:
            state.last_final = steps[-1]
        return done

    def last_final(self) -> dict[str, int]:
        """Each tag's last finalised step (or the one read back, for a tag not met since)."""
        last = dict(self._written)
        last.update((tag, state.last_final) for tag, state in self._tags.items() if state.last_final is not None)
        return last
