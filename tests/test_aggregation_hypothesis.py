"""The aggregation's arithmetic and step rules over arbitrary floats and steps (hypothesis, derandomized: the
same examples on every run; a failure prints the falsifying example to replay it)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from summaryd.server.aggregation.step_table import ColumnBatch, Reduction, StepTable, reduce

EXTREMES = [math.inf, -math.inf, math.nan, 0.0, -0.0, 5e-324, -5e-324, 2.2e-308, 1e308, -1e308, 1.7976931348623157e308]
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True), st.sampled_from(EXTREMES))
STEPS = st.one_of(
    st.integers(-3, 40), st.sampled_from([10**12, -(10**12), 2**62, -(2**62)]), st.integers(-(2**63), 2**63 - 1)
)
FIXED = settings(derandomize=True, max_examples=300, deadline=None, database=None)


def documented(values: list[float]) -> tuple[float, float, float, float]:
    """mean, min, max, std as README and DESIGN.md define them, computed exactly (with fractions) where finite."""
    if any(math.isnan(v) for v in values):
        return (math.nan,) * 4
    low, high = min(values), max(values)
    if math.isinf(low) or math.isinf(high):
        mean = math.nan if (low, high) == (-math.inf, math.inf) else (high if math.isinf(high) else low)
        return mean, low, high, math.nan
    exact = [Fraction(v) for v in values]
    mean = sum(exact) / len(exact)
    variance = sum((v - mean) ** 2 for v in exact) / len(exact)
    shift = math.frexp(max(-low, high))[1]
    std = math.ldexp(math.sqrt(float(variance / Fraction(2) ** (2 * shift))), shift) if variance else 0.0
    return float(mean), low, high, std


def close(got: float, want: float, scale: float) -> bool:
    if math.isnan(want) or math.isinf(want):
        return got == want or (math.isnan(got) and math.isnan(want))
    return abs(got - want) <= scale * 2.0**-48 + 2.0**-1072


def assert_documented(r: Reduction, values: list[float]) -> None:
    mean, low, high, std = documented(values)
    assert r.count == len(values)
    assert close(r.min, low, 0) and close(r.max, high, 0), (r, values)
    scale = max(abs(low), abs(high)) if math.isfinite(low) and math.isfinite(high) else 0.0
    assert close(r.mean, mean, scale) and close(r.std, std, scale), (r, (mean, low, high, std), values)
    if math.isfinite(r.mean):
        assert r.min <= r.mean <= r.max and 0.0 <= r.std <= r.max / 2 - r.min / 2


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


@FIXED
@given(st.lists(FLOATS, min_size=1, max_size=9), st.randoms(use_true_random=False))
def test_reductions_follow_the_documented_arithmetic_whatever_the_order(values: list[float], rng: object) -> None:
    r = reduce("t", 0, 0.0, values)
    assert_documented(r, values)
    shuffled = list(values)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    again = reduce("t", 0, 0.0, shuffled)
    for name in ("mean", "min", "max", "std"):
        assert same(getattr(again, name), getattr(r, name)), (name, values, shuffled)


@settings(derandomize=True, max_examples=60, deadline=None, database=None)
@given(st.lists(st.floats(-1e30, 1e30), min_size=64, max_size=300), st.randoms(use_true_random=False))
def test_reductions_of_many_workers_follow_the_documented_arithmetic_whatever_the_order(
    values: list[float], rng: object
) -> None:
    """The same over as many workers as a big job has (their squares are taken another way, `_sum_of_squares`)."""
    r = reduce("t", 0, 0.0, values)
    assert_documented(r, values)
    shuffled = list(values)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    assert r == reduce("t", 0, 0.0, shuffled)


PRE = -(2**63)  # every worker's first point: the tags are shared (reduced) from their first step on

Op = tuple[str, int, str, int, float]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("point"), st.integers(0, 2), st.sampled_from("ab"), STEPS, FLOATS),
        st.tuples(st.just("tick"), st.integers(0, 2), st.just(""), st.integers(0, 3), st.just(0.0)),
        st.tuples(st.sampled_from(["depart", "join"]), st.integers(0, 2), st.just(""), st.just(0), st.just(0.0)),
    ),
    max_size=60,
)


@FIXED
@given(st.integers(2, 3), OPS, st.sampled_from([10_000, 4]))
def test_no_step_is_lost_doubled_or_misreduced(world: int, ops: list[Op], max_pending: int) -> None:
    """Points of arbitrary values at arbitrary steps (far future, negative, out of order), ticks past the
    straggler timeout, departures and restarts: nothing raises; each step is written at most once, in ascending
    order, reduced as documented over each worker's last value for it; a point is either late (at or below its
    tag's last final step when it came), written, or its step was dropped beyond the frontier."""
    table = StepTable(world, max_pending)
    workers = [f"w{i}" for i in range(world)]
    values: dict[tuple[str, int], dict[str, float]] = {}
    written: dict[str, list[int]] = {"a": [], "b": []}
    now, late = 0.0, 0

    def take(done: list[Reduction]) -> None:
        for r in done:
            assert not written[r.tag] or r.step > written[r.tag][-1], (r, written[r.tag])
            written[r.tag].append(r.step)
            got = values.pop((r.tag, r.step))
            if table.dropped_steps == 0:  # a dropped step taken again only counts its later points
                assert_documented(r, list(got.values()))

    def add(worker: str, tag: str, step: int, value: float) -> None:
        nonlocal late
        last = table.last_final().get(tag)
        if last is not None and step <= last:
            late += 1
        else:
            values.setdefault((tag, step), {})[worker] = value
        table.add(worker, tag, step, now, value, now)
        take(table.complete())
        assert table.late_points == late

    for worker in workers:
        for tag in "ab":
            add(worker, tag, PRE, 1.0)
    for kind, index, tag, number, value in ops:
        worker = workers[index % world]
        if kind == "point":
            add(worker, tag, number, value)
        elif kind == "tick":
            now += number
            take(table.overdue(now, 1.0))
        elif kind == "depart":
            table.departed(worker)
            take(table.complete())
        else:
            table.joined(worker, world)
    for worker in workers:
        table.departed(worker)
    take(table.complete())
    frontier = table.frontier()
    take(table.drain())
    assert len(table) == 0
    if max_pending > 100:  # no bound reached: only the drain dropped steps, those beyond the frontier
        assert frontier is not None and all(step > frontier for _, step in values), (frontier, values)
        assert len(values) == table.dropped_steps
    else:
        assert len(values) <= table.dropped_steps


@FIXED
@given(st.lists(STEPS, min_size=1, max_size=30), st.integers(1, 10))
def test_one_worker_far_ahead_never_makes_the_others_late(spikes: list[int], others: int) -> None:
    """One worker's points at any steps, the others at 0..others: after any number of timeouts every step the
    others share is written (none of their points late)."""
    table = StepTable(3, max_pending=10_000)
    done: list[Reduction] = []
    for step in range(others):
        for spike in spikes:
            table.add("w0", "loss", spike, 0.0, 1.0, now=float(step))
        for worker in ("w1", "w2"):
            late = table.late_points
            table.add(worker, "loss", step, 0.0, 1.0, now=float(step))
            assert table.late_points == late, (worker, step, table.last_final())
        done += table.complete() + table.overdue(now=float(step) + 100.0, straggler_secs=1.0)
    assert set(range(others)) <= {r.step for r in done}


def _everything(_: str) -> bool:
    return True


def _all_but_c(tag: str) -> bool:
    return tag != "c"


BATCH_STEPS = st.one_of(st.integers(-2, 12), st.sampled_from([10**12, -(2**63), 2**63 - 1]))
POINT = st.tuples(st.sampled_from("abc"), BATCH_STEPS, st.floats(0, 1e9), st.floats(width=32))
TICKS = st.lists(
    st.one_of(
        st.tuples(st.just("batches"), st.lists(st.tuples(st.integers(0, 3), st.lists(POINT, max_size=6)), max_size=6)),
        st.tuples(st.sampled_from(["time", "depart", "join"]), st.integers(0, 3)),
    ),
    max_size=25,
)


def _outcome(table: StepTable, done: list[Reduction]) -> tuple[object, ...]:
    """What a user of the table sees: its reductions (NaN as text), where each worker stands, and its counts."""
    reductions = sorted(
        (r.tag, r.step, r.wall_time, r.count, *(repr(getattr(r, n)) for n in ("mean", "min", "max", "std")))
        for r in done
    )
    return (
        reductions,
        dict(table.progress),
        table.late_points,
        table.refused_points,
        table.dropped_steps,
        table.held_steps,
        len(table),
        table.last_final(),
        table.frontier(),
        table.lag(),
    )


@settings(derandomize=True, max_examples=1000, deadline=None, database=None)
@given(st.integers(2, 4), TICKS, st.sampled_from([10_000, 3]), st.sampled_from([10_000, 2]))
def test_batches_taken_as_columns_are_taken_as_point_by_point(
    world: int, ticks: list[tuple[object, ...]], max_pending: int, max_tags: int
) -> None:
    """Many batches taken at once as columns (`add_columns`, the group commit's path) leave the table exactly as
    taking each batch's points one by one (`add_all`) does: the same reductions, positions and counts, whatever
    the steps (repeated, out of order, far ahead, late), the tags (unwanted, beyond the limit) and the workers
    (departed, joined again, one worker in several batches)."""
    by_points = StepTable(world, max_pending, max_tags=max_tags)
    by_columns = StepTable(world, max_pending, max_tags=max_tags)
    workers = [f"w{i}" for i in range(4)]
    wanted = [_everything, _all_but_c, _everything, _all_but_c]
    now = 0.0
    for kind, *rest in ticks:
        done_points: list[Reduction] = []
        done_columns: list[Reduction] = []
        if kind == "batches":
            batches: list[ColumnBatch] = []
            for index, batch in rest[0]:  # type: ignore[attr-defined]
                tags = sorted({tag for tag, *_ in batch})
                by_points.add_all(
                    workers[index], [(t, s, w, float(np.float32(v))) for t, s, w, v in batch], wanted[index], now
                )
                batches.append(
                    ColumnBatch(
                        workers[index],
                        tags,
                        np.array([tags.index(t) for t, *_ in batch], dtype=np.int64),
                        np.array([s for _, s, _, _ in batch], dtype=np.int64),
                        np.array([w for _, _, w, _ in batch], dtype=np.float64),
                        np.array([v for *_, v in batch], dtype=np.float32),
                        wanted[index],
                    )
                )
            by_columns.add_columns(batches, now)
            done_points += by_points.complete()
            done_columns += by_columns.complete()
        elif kind == "time":
            now += rest[0]  # type: ignore[operator]
            done_points += by_points.overdue(now, 1.0)
            done_columns += by_columns.overdue(now, 1.0)
        else:
            for table, done in ((by_points, done_points), (by_columns, done_columns)):
                if kind == "depart":
                    table.departed(workers[rest[0]])  # type: ignore[index]
                    done.extend(table.complete())
                else:
                    table.joined(workers[rest[0]], world)  # type: ignore[index]
        assert _outcome(by_columns, done_columns) == _outcome(by_points, done_points), (kind, rest)
    assert _outcome(by_columns, by_columns.drain()) == _outcome(by_points, by_points.drain())
