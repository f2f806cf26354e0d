"""The parts of cross-worker aggregation on their own: the step table and the scalar points of a batch."""

from __future__ import annotations

import asyncio
import math

import numpy as np
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

from summaryd.server.aggregation.aggregator import (
    NO_STEP,
    REDUCTIONS,
    STATS_RUN,
    AggregateRuns,
    AggregationSettings,
    RunAggregator,
    WrittenThrough,
)
from summaryd.server.aggregation.step_table import Reduction, StepTable
from summaryd.server.records.scalar_points import points
from summaryd.server.records.scalar_records import ScalarRecords
from summaryd.server.security.limits import DEFAULT
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1.wire import frame_all


def steps_of(done: list[Reduction]) -> list[tuple[str, int, int]]:
    return [(r.tag, r.step, r.count) for r in done]


def test_a_step_is_final_once_every_worker_is_at_or_past_it() -> None:
    table = StepTable(3, max_pending=100)
    for worker in ("a", "b"):
        for step in range(3):
            table.add(worker, "loss", step, 1.0, float(step), now=0.0)
    assert table.complete() == []  # the third worker has not reported: nothing is final
    table.add("c", "loss", 1, 1.0, 1.0, now=0.0)  # c skipped step 0: it will not come
    assert steps_of(table.complete()) == [("loss", 0, 2), ("loss", 1, 3)]
    table.add("c", "loss", 2, 1.0, 2.0, now=0.0)
    [last] = table.complete()
    assert (last.step, last.count, last.mean, last.min, last.max, last.std) == (2, 3, 2.0, 2.0, 2.0, 0.0)


def test_reductions_are_mean_min_max_and_population_std() -> None:
    table = StepTable(4, max_pending=100)
    for worker, value in zip("abcd", (1.0, 2.0, 4.0, 9.0), strict=True):
        table.add(worker, "x", 7, 10.0 + value, value, now=0.0)
    [r] = table.complete()
    assert (r.step, r.count, r.mean, r.min, r.max, r.wall_time) == (7, 4, 4.0, 1.0, 9.0, 19.0)
    assert r.std == math.sqrt(((1 - 4) ** 2 + (2 - 4) ** 2 + 0 + (9 - 4) ** 2) / 4)


def test_a_straggler_is_not_waited_for_beyond_the_timeout() -> None:
    table = StepTable(3, max_pending=100)
    table.add("a", "loss", 0, 1.0, 1.0, now=10.0)
    table.add("b", "loss", 0, 1.0, 3.0, now=10.5)
    table.add("a", "loss", 1, 1.0, 1.0, now=11.0)
    assert table.overdue(now=12.9, straggler_secs=3.0) == []
    [r] = table.overdue(now=13.0, straggler_secs=3.0)
    assert (r.step, r.count, r.mean) == (0, 2, 2.0)
    table.add("c", "loss", 0, 1.0, 100.0, now=13.1)  # late: the step is final, the point is not taken
    assert table.late_points == 1
    # Step 1 is overdue but only a reached it: it waits for a second worker there (the frontier), not for all.
    assert table.overdue(now=20.0, straggler_secs=3.0) == []
    table.add("b", "loss", 1, 1.0, 5.0, now=20.5)
    [r] = table.overdue(now=21.0, straggler_secs=3.0)
    assert (r.step, r.count, r.mean) == (1, 2, 3.0)


def test_a_worker_that_left_holds_no_step_back() -> None:
    """Of two workers, one's session ended (lost or released, as a hung worker's is after the session lease):
    the other's steps beyond where it stood are written after the timeout with the worker that has them."""
    table = StepTable(2, max_pending=100)
    for worker in ("a", "b"):
        table.add(worker, "loss", 0, 1.0, 1.0, now=0.0)
    for step in (1, 2):
        table.add("a", "loss", step, 1.0, 1.0, now=0.1)
    # b may come back: its steps beyond where b stood are held at the frontier
    assert [(r.step, r.count) for r in table.overdue(now=10.0, straggler_secs=3.0)] == [(0, 2)]
    table.departed("b")
    assert [(r.step, r.count) for r in table.overdue(now=10.0, straggler_secs=3.0)] == [(1, 1), (2, 1)]


def test_pending_steps_are_bounded_oldest_first() -> None:
    table = StepTable(3, max_pending=3)
    for step in range(5):
        table.add("a", "loss", step, 1.0, 1.0, now=float(step))
        table.add("b", "loss", step, 1.0, 1.0, now=float(step))
    assert [r.step for r in table.complete()] == [0, 1]
    assert len(table) == 3


def test_a_tag_only_one_worker_logs_is_not_reduced() -> None:
    """Frameworks log from rank 0 only: its steps are finalised without a reduction (no aggregate runs appear)."""
    table = StepTable(2, max_pending=100)
    table.add("a", "loss", 0, 1.0, 1.0, now=0.0)
    assert table.overdue(now=100.0, straggler_secs=1.0) == []
    assert (len(table), table.last_final()) == (0, {"loss": 0})
    table.add("b", "loss", 1, 1.0, 3.0, now=100.0)  # a second worker: from now on the tag is reduced
    table.add("a", "loss", 2, 1.0, 1.0, now=100.0)  # a is past step 1 too: it is within the frontier
    assert [(r.step, r.count) for r in table.overdue(now=200.0, straggler_secs=1.0)] == [(1, 1)]


def test_a_departed_worker_is_not_waited_for_and_a_restarted_one_is_again() -> None:
    table = StepTable(2, max_pending=100)
    table.add("a", "loss", 5, 1.0, 1.0, now=0.0)
    table.add("b", "loss", 3, 1.0, 1.0, now=0.0)
    assert [r.step for r in table.complete()] == [3]
    table.departed("b")
    assert [r.step for r in table.complete()] == [5]
    assert not table.world_left()
    table.joined("b", 2)  # a new session of b: steps wait for it again, from where it reports
    table.add("a", "loss", 6, 1.0, 1.0, now=0.0)
    assert table.complete() == []
    table.add("b", "loss", 4, 1.0, 1.0, now=0.0)  # steps start lower: at or below the last final step
    assert table.late_points == 1
    assert table.lag() == {"a": 0, "b": 2}


def test_steps_already_written_are_never_taken_again() -> None:
    table = StepTable(2, max_pending=100, last_final={"loss": 10})
    for worker in ("a", "b"):
        table.add(worker, "loss", 10, 1.0, 1.0, now=0.0)
        table.add(worker, "loss", 11, 1.0, 1.0, now=0.0)
    assert table.late_points == 2
    assert [r.step for r in table.complete()] == [11]
    assert table.last_final() == {"loss": 11}


def written_through(files: dict[str, list[tuple[str, int]]]) -> WrittenThrough:
    """What a restarted aggregator reads back of aggregate runs holding `files` (run name: tag and step)."""
    written = WrittenThrough()
    for name, logged in files.items():
        records = (event(Summary.Value(tag=tag, simple_value=1.0), step=step) for tag, step in logged)
        written.read(name, frame_all(records))
    written.settle()
    return written


def test_each_aggregate_run_is_read_back_on_its_own_and_the_lagging_one_sets_the_frontier() -> None:
    """A daemon killed between the five runs' writes: the tag's last final step is the one every run reached,
    and each run ahead of it says how far; the watch's findings and the lag in `summaryd` are not tags."""
    files = {name: [("loss", 0), ("loss", 9)] for name in REDUCTIONS}
    files["max"] = [("loss", 0), ("loss", 12)]
    files[STATS_RUN] = [("count/loss", 7), ("lag_steps/rank-0", 7), ("watch/nonfinite", 8)]
    written = written_through(files)
    assert written.last == {"loss": 7}
    assert written.lag_step == 7
    assert written.ahead == {name: {"loss": 12 if name == "max" else 9} for name in REDUCTIONS}
    files[STATS_RUN] = [("watch/nonfinite", 8)]  # the tag's first step reached some runs, not the counts
    assert written_through(files).last == {"loss": NO_STEP}


def test_an_aggregate_run_ahead_is_written_only_the_steps_it_lacks() -> None:
    written = []

    class Writer:
        def __init__(self, name: str) -> None:
            self.name = name

        async def write(self, _session: str, _sequence: int, records: ScalarRecords) -> None:
            written.append((self.name, [Event.FromString(r).step for r in records]))

    runs = AggregateRuns("job", None, DEFAULT)  # type: ignore[arg-type]
    runs._writers = {name: Writer(name) for name in (*REDUCTIONS, STATS_RUN)}  # type: ignore[misc]
    runs._ahead = {"max": {"loss": 11}, STATS_RUN: {"loss": 12}}
    done = [Reduction("loss", step, 0.0, 2, 1.0, 1.0, 1.0, 0.0) for step in (10, 11, 12)]
    asyncio.run(runs.write(done, None))
    assert dict(written) == {"mean": [10, 11, 12], "min": [10, 11, 12], "max": [12], "std": [10, 11, 12]}
    assert runs._ahead == {STATS_RUN: {"loss": 12}}  # max went past its step: forgotten; the counts not yet


def event(*values: Summary.Value, step: int = 3) -> bytes:
    return Event(wall_time=5.0, step=step, summary=Summary(value=list(values))).SerializeToString()


def test_points_of_serialized_summaries_simple_values_and_scalar_tensors() -> None:
    scalars = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))
    images = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="images"))
    tf2 = TensorProto(dtype=1, tensor_shape=TensorShapeProto(), float_val=[0.5])
    content = TensorProto(dtype=2, tensor_shape=TensorShapeProto(), tensor_content=np.float64(2.25).tobytes())
    vector = TensorProto(dtype=1, tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=2)]), float_val=[1, 2])
    batch = [
        event(Summary.Value(tag="simple", simple_value=1.5)),
        event(Summary.Value(tag="tf2", tensor=tf2, metadata=scalars)),
        event(Summary.Value(tag="tf2", tensor=tf2), step=4),  # metadata only on a tag's first event
        event(Summary.Value(tag="double", tensor=content)),
        event(Summary.Value(tag="vector", tensor=vector), Summary.Value(tag="image", tensor=tf2, metadata=images)),
        Event(wall_time=1.0, file_version="x").SerializeToString(),
    ]
    assert list(points(batch)) == [
        ("simple", 3, 5.0, 1.5),
        ("tf2", 3, 5.0, 0.5),
        ("tf2", 4, 5.0, 0.5),
        ("double", 3, 5.0, 2.25),
    ]


def test_points_of_scalar_columns_are_read_from_the_columns_and_their_tail() -> None:
    columns = pb.ScalarColumns(
        tags=["a", "b"], tag_index=[0, 1, 0], step=[1, 2, 3], wall_time=[1.0, 2.0, 3.0], value=[0.1, 2.0, 3.0]
    )
    assert list(points(ScalarRecords(columns))) == [
        ("a", 1, 1.0, float(np.float32(0.1))),
        ("b", 2, 2.0, 2.0),
        ("a", 3, 3.0, 3.0),
    ]
    assert list(points(ScalarRecords(columns)[2:])) == [("a", 3, 3.0, 3.0)]


class _RaisingOnce(StepTable):
    """A step table whose first `overdue` raises: no finalisation is known to raise any more (the arithmetic
    is total), so this fake makes the fault the run's timer must survive."""

    raised = False

    def overdue(self, now: float, straggler_secs: float) -> list[Reduction]:
        if not self.raised:
            self.raised = True
            raise RuntimeError("a finalisation that raised")
        return super().overdue(now, straggler_secs)


def test_a_raise_in_finalisation_never_stops_the_runs_timer() -> None:
    """The timer logs and counts the raise, then goes on: it finalises the overdue step on its next tick and
    still tells that the run went idle."""

    async def tick() -> tuple[RunAggregator, int]:
        aggregator = RunAggregator(AggregateRuns("job", None, DEFAULT), AggregationSettings(True, 0.01))  # type: ignore[arg-type]
        aggregator.table = _RaisingOnce(2, max_pending=100)
        for worker in ("a", "b"):
            aggregator.table.add(worker, "loss", 0, 1.0, 1.0, now=0.0)
        aggregator.idle_since = 0.0
        idled: list[RunAggregator] = []
        ticker = asyncio.create_task(aggregator._tick(0.01, idled.append))
        while not (aggregator.table.last_final() and idled) and not ticker.done():
            await asyncio.sleep(0.01)
        ticker.cancel()
        return aggregator, len(idled)

    aggregator, idled = asyncio.run(asyncio.wait_for(tick(), 60))
    assert (aggregator.failures, aggregator.table.last_final(), idled > 0) == (1, {"loss": 0}, True)


def test_a_loop_iterations_batches_are_taken_together_and_a_bad_one_fails_alone() -> None:
    """Batches written in one iteration of the event loop are taken at its end, as columns from 16 on; a batch
    that cannot be taken (a tag index beyond its batch's tags: refused before a write, so never seen in a
    daemon) fails alone, logged and counted, and the others of its iteration are taken."""

    def batch(step: int, tag_index: int = 0) -> ScalarRecords:
        return ScalarRecords(
            pb.ScalarColumns(tags=["loss"], tag_index=[tag_index], step=[step], wall_time=[1.0], value=[float(step)])
        )

    async def feed() -> tuple[RunAggregator, list[Reduction]]:
        aggregator = RunAggregator(AggregateRuns("job", None, DEFAULT), AggregationSettings(True, 60.0))  # type: ignore[arg-type]
        aggregator._runs._writers = {"mean": None}  # type: ignore[dict-item]  # live, with nothing to write to
        workers = [f"rank-{rank}" for rank in range(20)]
        for worker in workers:
            aggregator.joined(worker, len(workers))
        finalised: list[Reduction] = []
        aggregator._finish = finalised.extend  # type: ignore[method-assign]
        for worker in workers:
            aggregator.take(worker, bool, batch(0, tag_index=1 if worker == "rank-7" else 0))
        await asyncio.sleep(0)
        assert aggregator.failures == 1 and not finalised  # step 0 waits for rank-7
        for worker in workers:
            aggregator.take(worker, bool, batch(1))
        assert set(aggregator.table.progress.values()) == {0}  # nothing taken before the iteration's end
        await asyncio.sleep(0)
        return aggregator, finalised

    aggregator, finalised = asyncio.run(asyncio.wait_for(feed(), 60))
    assert [(r.tag, r.step, r.count, r.mean) for r in finalised] == [("loss", 0, 19, 0.0), ("loss", 1, 20, 1.0)]
    assert aggregator.failures == 1
