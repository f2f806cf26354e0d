"""Group commit (`storage.runs.GroupCommit`) on a real logdir, state directory and I/O threads, read back with
TensorBoard's reader: the batches that arrive together are written per run in one write, in order; a refused
batch fails alone; a batch's bytes are freed when its write returns, not by the cyclic collector; and a busy
commit waits out its tick only while some write stream may still send a batch."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Executor
from pathlib import Path

import pytest
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from _support import assert_whole_records, event_files, read_events
from summaryd.server.errors import EventError
from summaryd.server.io_threads import io_executor
from summaryd.server.records.scalar_records import ScalarRecords
from summaryd.server.sessions.streams import WriteStreams
from summaryd.server.storage import event_file
from summaryd.server.storage.runs import GroupCommit, RunRegistry
from summaryd.server.storage.state import StateDir
from summaryd.v1 import summaryd_pb2 as pb


def scalars(worker: int, first: int, count: int) -> list[bytes]:
    return [
        Event(
            wall_time=1.0, step=step, summary=Summary(value=[Summary.Value(tag=f"w{worker}", simple_value=step)])
        ).SerializeToString()
        for step in range(first, first + count)
    ]


class Events(list[bytes]):
    """A batch that can be watched for being freed (a plain list takes no weak reference)."""


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[RunRegistry]:
    executor = io_executor(2)
    state = StateDir(str(tmp_path / "runs" / ".summaryd"), retention_secs=86400)
    runs = RunRegistry(str(tmp_path / "runs"), executor, state.journal_dir_fd)
    try:
        yield runs
    finally:
        await runs.close_all()
        runs.close()
        state.close()
        executor.shutdown(wait=True)


@pytest.fixture
def executor() -> Iterator[Executor]:
    """An I/O thread for a commit the test makes itself (its tick, its count of streams)."""
    threads = io_executor(1)
    yield threads
    threads.shutdown(wait=True)


@pytest.fixture
def appends(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The size of every append to an event file (the real append, counted)."""
    sizes: list[int] = []
    real = event_file.EventFile.append

    def counted(self: event_file.EventFile, blob: bytes) -> None:
        sizes.append(len(blob))
        real(self, blob)

    monkeypatch.setattr(event_file.EventFile, "append", counted)
    yield sizes


def columns(worker: int, first: int, count: int, wall_time: float = 1.7e9) -> ScalarRecords:
    """A rank's batch of scalar columns, as a client sends it: `count` steps of two tags."""
    steps = [step for step in range(first, first + count) for _ in range(2)]
    return ScalarRecords(
        pb.ScalarColumns(
            tags=[f"loss/{worker}", "lr"],
            tag_index=[0, 1] * count,
            step=steps,
            value=[step / 2 for step in steps],
            wall_time=[wall_time] * len(steps),
        )
    )


def steps_by_tag(run: Path) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for path in event_files(run):
        assert_whole_records(path)
        for e in read_events(path):
            for value in e.summary.value:
                found.setdefault(value.tag, []).append(e.step)
    return found


async def test_batches_that_arrive_together_are_one_write_per_run_in_order(
    registry: RunRegistry, appends: list[int], tmp_path: Path
) -> None:
    writer = await registry.acquire(["job"])
    await writer.write("s0", 1, scalars(0, 1, 1))  # opens the file: a commit of its own
    appends.clear()
    # 16 sessions' batches, 4 each, all queued before the event loop lets a commit run.
    batches = [writer.write(f"s{w}", 10 * n + 10, scalars(w, 10 * n + 1, 10)) for n in range(4) for w in range(16)]
    await asyncio.gather(*batches)
    assert len(appends) == 1, f"{len(appends)} writes for 64 batches that arrived together"
    found = steps_by_tag(tmp_path / "runs" / "job")
    for w in range(16):
        assert found[f"w{w}"] == ([1] if w == 0 else []) + list(range(1, 41)), f"worker {w}'s steps out of order"
    assert writer.marks == {f"s{w}": 40 for w in range(16)}


async def test_a_refused_batch_fails_alone_and_the_rest_of_its_group_is_written(
    registry: RunRegistry, tmp_path: Path
) -> None:
    writer = await registry.acquire(["job"])
    await writer.write("s0", 1, scalars(0, 1, 1))
    good = [writer.write(f"s{w}", 14, scalars(w, 10, 5)) for w in range(4)]
    bad = writer.write("bad", 3, [b"\xff not an event", b"", b"\x00"])
    results = await asyncio.gather(*good, bad, return_exceptions=True)
    assert [r for r in results[:4]] == [None] * 4
    assert isinstance(results[4], EventError)
    found = steps_by_tag(tmp_path / "runs" / "job")
    assert all(found[f"w{w}"] == ([1] if w == 0 else []) + list(range(10, 15)) for w in range(4))
    assert "bad" not in writer.marks


async def test_a_batch_is_freed_when_its_write_returns_not_by_the_cyclic_collector(registry: RunRegistry) -> None:
    """Under a flood a batch left to the cyclic collector stayed for a hundred batches (`test_faults_flood`)."""
    writer = await registry.acquire(["job"])
    await writer.write("s0", 1, scalars(0, 1, 1))
    gc.collect()
    gc.disable()
    try:
        for refused in (False, True):
            batch = Events([b"\xff not an event"] if refused else scalars(0, 2, 3))
            freed = weakref.ref(batch)
            try:
                await writer.write("s0", len(batch) + 1, batch)
            except EventError:
                assert refused
            del batch
            await asyncio.sleep(0)  # the commit task's own end
            assert freed() is None, f"a {'refused' if refused else 'written'} batch outlived its write"
    finally:
        gc.enable()


async def test_many_runs_batches_of_columns_framed_together_are_each_written_as_sent(
    registry: RunRegistry, tmp_path: Path
) -> None:
    # 32 ranks' runs, 4 batches each, all queued at once: one commit frames them in one pass
    # (`framed_together`); one batch with a bad wall time among them fails alone, named as it is.
    writers = [await registry.acquire(["job", f"rank-{rank}"]) for rank in range(32)]
    for rank, writer in enumerate(writers):
        await writer.write("s", 1, columns(rank, 1, 1))  # opens the file: a commit of its own
    batches = [
        writer.write("s", 10 * n + 11, columns(rank, 10 * n + 2, 10))
        for n in range(4)
        for rank, writer in enumerate(writers)
    ]
    bad = writers[5].write("bad", 3, columns(5, 100, 3, wall_time=float("nan")))
    results = await asyncio.gather(*batches, bad, return_exceptions=True)
    assert results[:-1] == [None] * len(batches)
    assert isinstance(results[-1], EventError) and "wall_time nan" in str(results[-1])
    for rank in range(32):
        found: dict[str, list[tuple[int, float]]] = {}
        for path in event_files(tmp_path / "runs" / "job" / f"rank-{rank}"):
            assert_whole_records(path)
            for e in read_events(path):
                for value in e.summary.value:
                    assert e.wall_time == 1.7e9
                    found.setdefault(value.tag, []).append((e.step, value.simple_value))
        expected = [(step, step / 2) for step in range(1, 42)]
        assert found == {f"loss/{rank}": expected, "lr": expected}, f"rank {rank}"


async def test_one_streams_back_to_back_batches_never_wait_out_the_tick(
    registry: RunRegistry, executor: Executor, tmp_path: Path
) -> None:
    # A tick of an hour: a batch that waited it would time the test out. One client's stream sends its next batch
    # once this one is answered, so no other batch can join the commit: it goes at once, however busy.
    streams = WriteStreams()
    streams.open = 1
    writer = await registry.acquire(["job"])
    writer.commit = GroupCommit(executor, tick=3600, commit_now=streams.commit_now)
    for step in range(1, 21):
        streams.waiting += 1  # as the service counts a stream's batch
        try:
            await asyncio.wait_for(writer.write("s0", step, scalars(0, step, 1)), 30)
        finally:
            streams.waiting -= 1
    assert steps_by_tag(tmp_path / "runs" / "job") == {"w0": list(range(1, 21))}


async def test_a_busy_commit_waits_until_every_open_stream_waits_for_a_write(
    registry: RunRegistry, executor: Executor, appends: list[int], tmp_path: Path
) -> None:
    streams = WriteStreams()
    streams.open = 3
    writer = await registry.acquire(["job"])
    writer.commit = GroupCommit(executor, tick=3600, commit_now=streams.commit_now)

    async def write(worker: int, last: int, step: int) -> None:
        streams.waiting += 1
        try:
            await writer.write(f"s{worker}", last, scalars(worker, step, 1))
        finally:
            streams.waiting -= 1

    await write(0, 1, 1)  # after a quiet tick: at once
    appends.clear()
    first = [asyncio.ensure_future(write(w, 10, 10)) for w in (1, 2)]
    await asyncio.sleep(0.3)
    assert not any(w.done() for w in first), "a busy commit went while a third stream could still send a batch"
    assert appends == []
    await asyncio.wait_for(asyncio.gather(write(3, 10, 10), *first), 30)
    assert len(appends) == 1, "the three streams' batches were not one commit"
    assert steps_by_tag(tmp_path / "runs" / "job") == {"w0": [1], "w1": [10], "w2": [10], "w3": [10]}


async def test_a_busy_commit_goes_after_its_tick_without_the_streams_that_send_nothing(
    registry: RunRegistry, executor: Executor, appends: list[int]
) -> None:
    writer = await registry.acquire(["job"])
    writer.commit = GroupCommit(executor, tick=0.2, commit_now=lambda: False)  # streams that never send
    await writer.write("s0", 1, scalars(0, 1, 1))
    appends.clear()
    await asyncio.wait_for(asyncio.gather(*(writer.write(f"s{w}", 10, scalars(w, 10, 1)) for w in (1, 2))), 30)
    assert len(appends) == 1
