"""Pending steps of one aggregated run: each scalar tag's points by step, with one value per worker.

A step of a tag is finalised once every worker of the world is past it or at it, after the straggler timeout
with the workers that reported it, when the pending bound is reached (the oldest first), or when the run's last
session leaves; it becomes a `Reduction` once two workers have ever reported the tag. A tag's steps are
finalised in ascending order, and a point at or below a tag's last finalised step is not taken: an aggregate
once written is never written again.

Nothing here does I/O or keeps time itself; the caller passes the clock. Per point the work is a few dict
operations; completion is checked once per batch for each tag the batch touched.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field


def _every_tag(_: str) -> bool:
    return True


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
    """The reductions of `values`: mean, min, max and the population standard deviation (numerically careful:
    `math.fsum` for both sums, so that the result depends on the values only, not on their order)."""
    points = list(values)
    count = len(points)
    mean = math.fsum(points) / count
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in points) / count)
    return Reduction(tag, step, wall_time, count, mean, min(points), max(points), std)


@dataclass
class _Step:
    first_seen: float
    wall_time: float = 0.0
    values: dict[str, float] = field(default_factory=dict)


@dataclass
class _Tag:
    pending: dict[int, _Step] = field(default_factory=dict)
    # Each worker's latest step of this tag (the step of its last point, not the largest: a restart lowers it).
    latest: dict[str, int] = field(default_factory=dict)
    last_final: int | None = None
    # Whether two workers ever reported the tag: a tag only one worker logs (frameworks log from rank 0 only)
    # has nothing to reduce, and its steps are finalised without a reduction.
    shared: bool = False


class StepTable:
    """The pending steps of one run's tags, and which workers stand where."""

    def __init__(self, world_size: int, max_pending: int, last_final: Mapping[str, int] | None = None) -> None:
        self.world_size = world_size
        self.max_pending = max_pending
        self._tags: dict[str, _Tag] = {}
        for tag, step in (last_final or {}).items():
            self._tags[tag] = _Tag(last_final=step)
        # Pending steps in the order they were opened (entries of steps finalised since are skipped when met).
        self._arrivals: deque[tuple[float, str, int]] = deque()
        self._pending = 0
        self._touched: set[str] = set()
        self._departed: set[str] = set()
        # Each worker's progress: the step of its last point of any tag.
        self.progress: dict[str, int] = {}
        self.late_points = 0

    def __len__(self) -> int:
        """Pending steps over all tags."""
        return self._pending

    # ---- the world -------------------------------------------------------------------------------------

    def joined(self, worker: str, world_size: int) -> None:
        """A session of `worker` opened (anew, or after a restart: where it stood is forgotten until it reports)."""
        self.world_size = max(self.world_size, world_size)
        self._departed.discard(worker)
        for state in self._tags.values():
            state.latest.pop(worker, None)

    def departed(self, worker: str) -> None:
        """`worker` has no session left: steps no longer wait for it."""
        self._departed.add(worker)
        self._touched.update(self._tags)

    def world_left(self) -> bool:
        """Whether every worker of the world has left (the job ended)."""
        return len(self._departed) >= self.world_size

    def lag(self) -> dict[str, int]:
        """Per worker, how many steps it is behind the furthest one."""
        if not self.progress:
            return {}
        leader = max(self.progress.values())
        return {worker: leader - step for worker, step in self.progress.items()}

    # ---- points ----------------------------------------------------------------------------------------

    def add(self, worker: str, tag: str, step: int, wall_time: float, value: float, now: float) -> None:
        """Take one point of `worker` (see `add_all`)."""
        self.add_all(worker, [(tag, step, wall_time, value)], _every_tag, now)

    def add_all(
        self, worker: str, points: Iterable[tuple[str, int, float, float]], wanted: Callable[[str], bool], now: float
    ) -> None:
        """Take the points (tag, step, wall time, value) of one batch of `worker` whose tag is `wanted`. A later
        value of the same worker and step replaces the earlier one. The hot loop of aggregation: a batch's
        points come in runs of one tag, so the tag's state is looked up once per run."""
        tags, arrivals = self._tags, self._arrivals
        state, current, skip, last = _Tag(), None, False, None
        for tag, step, wall_time, value in points:
            if tag != current:
                current, skip = tag, not wanted(tag)
                if skip:
                    continue
                found = tags.get(tag)
                state = tags[tag] = found if found is not None else _Tag()
                self._touched.add(tag)
            elif skip:
                continue
            state.latest[worker] = last = step
            if state.last_final is not None and step <= state.last_final:
                self.late_points += 1
                continue
            pending = state.pending.get(step)
            if pending is None:
                pending = state.pending[step] = _Step(now, wall_time)
                arrivals.append((now, tag, step))
                self._pending += 1
            elif wall_time > pending.wall_time:  # a call to max costs more on this path
                pending.wall_time = wall_time
            pending.values[worker] = value
        if last is not None:
            self.progress[worker] = last

    # ---- finalising ------------------------------------------------------------------------------------

    def complete(self) -> list[Reduction]:
        """Finalise every step that all workers are at or past, of the tags touched since the last call; then,
        beyond the pending bound, the oldest steps."""
        done: list[Reduction] = []
        touched, self._touched = self._touched, set()
        for tag in touched:
            state = self._tags[tag]
            through = self._watermark(state)
            if through is not None and state.pending:
                done += self._finalise(tag, state, through)
        while self._pending > self.max_pending:
            head = self._oldest()
            if head is None:
                break
            done += self._finalise(head[1], self._tags[head[1]], head[2])
        return done

    def overdue(self, now: float, straggler_secs: float) -> list[Reduction]:
        """Finalise, with the workers that reported them, the steps pending for longer than `straggler_secs`
        (and each such tag's earlier steps with them)."""
        done: list[Reduction] = []
        while (head := self._oldest()) is not None and now - head[0] >= straggler_secs:
            done += self._finalise(head[1], self._tags[head[1]], head[2])
        return done

    def drain(self) -> list[Reduction]:
        """Finalise everything pending (the run's last session left, or the daemon stops)."""
        done: list[Reduction] = []
        for tag, state in self._tags.items():
            if state.pending:
                done += self._finalise(tag, state, max(state.pending))
        self._arrivals.clear()
        return done

    def _watermark(self, state: _Tag) -> int | None:
        """The step every worker of the world is at or past, or None while some worker of it has not reported."""
        if len(state.latest.keys() | self._departed) < self.world_size:
            return None
        active = [step for worker, step in state.latest.items() if worker not in self._departed]
        return min(active) if active else max(state.pending, default=None)

    def _oldest(self) -> tuple[float, str, int] | None:
        """The oldest pending step's arrival entry, having dropped the entries of steps finalised since."""
        arrivals = self._arrivals
        while arrivals:
            _, tag, step = arrivals[0]
            if step in self._tags[tag].pending:
                return arrivals[0]
            arrivals.popleft()
        return None

    def _finalise(self, tag: str, state: _Tag, through: int) -> list[Reduction]:
        steps = sorted(step for step in state.pending if step <= through)
        done = []
        for step in steps:
            pending = state.pending.pop(step)
            state.shared = state.shared or len(state.latest) > 1 or len(pending.values) > 1
            if state.shared:
                done.append(reduce(tag, step, pending.wall_time, pending.values.values()))
        self._pending -= len(steps)
        if steps:
            state.last_final = steps[-1]
        return done

    def last_final(self) -> dict[str, int]:
        """Each tag's last finalised step."""
        return {tag: state.last_final for tag, state in self._tags.items() if state.last_final is not None}
