"""The daemon's records from scalar columns, byte for byte the client's own events framed by `wire.frame_all`,
over many random batches of every shape the columns can take."""

from __future__ import annotations

import math
import random

import pytest

from summaryd.client._sender._columns import ScalarRun
from summaryd.client._sender._kinds import SCALAR
from summaryd.server.errors import EventError
from summaryd.server.records.scalar_records import ScalarRecords, framed_together
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1.wire import frame_all

TAGS = [
    "",
    "a",
    "loss",
    "acc1",
    "loss/train",
    "loss/valid",
    "é" * 40,
    "日本語/精度",
    "t" * 120,
    "u" * 127,
    "v" * 128,
    "w" * 300,
]
STEPS = [0, 1, 127, 128, 16383, 16384, (1 << 56) - 1, 1 << 56, (1 << 63) - 1, -1, -128, -(1 << 63)]
VALUES = [0.0, -0.0, 1.0, -2.5, math.nan, math.inf, -math.inf, 1e-45, 3.4e38, 1e39, 123.456]
WALL_TIMES = [0.0, -0.0, 1.0, 1.7e9, 2.0**52, 5e-324]


def _step(rng: random.Random, mode: str, index: int, base: int) -> int:
    if mode == "consecutive":
        return base + index
    if mode == "per step":
        return base + index // 7
    return rng.choice([*STEPS, rng.randrange(-(1 << 63), 1 << 63), rng.randrange(1 << 20)])


def _batch(rng: random.Random) -> ScalarRun:
    """A random batch as the client queues it: `(tag, value, step, wall_time, bytes)` in queue order."""
    count = rng.choice([1, 2, 3, rng.randrange(1, 50), rng.randrange(50, 2000)])
    tags = rng.sample(TAGS, rng.randrange(1, 5))
    mode = rng.choice(["consecutive", "per step", "random"])
    base = rng.choice([0, 100, 16380, (1 << 56) - 5, -3, -(1 << 63)])
    now = rng.uniform(0.0, 2e9)
    wall_mode = rng.choice(["one", "clock", "random"])
    one_value = rng.choice([None, *VALUES])  # a batch of one value: only the other fields differ between records
    items = []
    for index in range(count):
        step = max(-(1 << 63), min((1 << 63) - 1, _step(rng, mode, index, base)))
        wall = {"one": now, "clock": now + index * 1e-5, "random": rng.choice([*WALL_TIMES, rng.random() * 2e9])}
        value = rng.choice([*VALUES, rng.uniform(-1e6, 1e6), rng.random()]) if one_value is None else one_value
        items.append((SCALAR, rng.choice(tags), value, step, wall[wall_mode], 0))
    return ScalarRun.of(items)


@pytest.mark.parametrize("seed", range(40))
def test_random_batches_and_their_tails_frame_as_the_clients_events(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(10):
        run = _batch(rng)
        columns = run.fill(pb.ScalarColumns(), fixed_steps=rng.random() < 0.5)  # steps in either field
        events = run.encoded()
        for start in sorted({0, 1, len(events) // 2, len(events) - 1}):
            if start < len(events):
                assert ScalarRecords(columns)[start:].framed() == frame_all(events[start:]), (seed, start)


def test_shapes_interleaved_record_by_record_frame_in_batch_order() -> None:
    # Tags of other sizes in turn, steps crossing varint sizes, wall times left out and written: no two
    # neighbours share a shape, so the records are put back by offset.
    items = [
        (SCALAR, TAGS[index % len(TAGS)], index * 0.5, STEPS[index % len(STEPS)], [0.0, 1.5][index % 2], 0)
        for index in range(3000)
    ]
    run = ScalarRun.of(items)
    assert ScalarRecords(run.fill(pb.ScalarColumns())).framed() == frame_all(run.encoded())


@pytest.mark.parametrize("seed", range(20))
def test_many_batches_framed_together_are_each_framed_as_the_clients_events(seed: int) -> None:
    # A group commit's batches of other runs (other tags, steps, shapes, tails), framed in one pass.
    rng = random.Random(seed)
    runs = [_batch(rng) for _ in range(rng.randrange(2, 30))]
    batches, expected = [], []
    for run in runs:
        events = run.encoded()
        start = rng.choice([0, 0, len(events) - 1])
        batches.append(ScalarRecords(run.fill(pb.ScalarColumns(), fixed_steps=rng.random() < 0.5))[start:])
        expected.append(frame_all(events[start:]))
    assert framed_together(batches) == expected, seed


def test_batches_framed_together_leave_a_bad_one_to_be_framed_alone() -> None:
    # One bad wall time among good batches: nothing is framed together, and the bad batch's own framing names
    # its scalar.
    good = ScalarRun.of([(SCALAR, "loss", 1.0, step, 1.7e9, 0) for step in range(100)])
    bad = pb.ScalarColumns(tags=["loss"], tag_index=[0, 0], step=[1, 2], value=[1.0, 2.0], wall_time=[1.7e9, -1.0])
    batches = [ScalarRecords(good.fill(pb.ScalarColumns())), ScalarRecords(bad)]
    assert framed_together(batches) is None
    with pytest.raises(EventError, match=r"wall_time -1\.0"):
        batches[1].framed()


def test_batches_with_columns_of_unequal_lengths_are_not_framed_together() -> None:
    # Two such batches joined would shift each other's points onto the wrong tags; each is left to frame alone.
    longer = pb.ScalarColumns(tags=["a", "b"], tag_index=[0, 1, 1], step=[1, 2], value=[1.0, 2.0], wall_time=[1.0, 1.0])
    shorter = pb.ScalarColumns(tags=["a", "b"], tag_index=[0], step=[1, 2], value=[1.0, 2.0], wall_time=[1.0, 1.0])
    assert framed_together([ScalarRecords(longer), ScalarRecords(shorter)]) is None
    # Nor an empty one (a tail of nothing), whose end would be taken for the last batch's.
    good = pb.ScalarColumns(tags=["a"], tag_index=[0], step=[1], value=[1.0], wall_time=[1.0])
    assert framed_together([ScalarRecords(good)[1:], ScalarRecords(good)]) is None
