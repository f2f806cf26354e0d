"""The client's scalars travel as columns to a daemon that takes them, and as serialized events to one that does
not, in the order they were logged among other events, to byte-identical files."""

from __future__ import annotations

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2

from _support import Daemon, assert_whole_records, event_files
from summaryd.client import SummaryWriter
from summaryd.client._sender import _grpc_transport
from summaryd.client._sender._batch_fit import DaemonLimits
from summaryd.client._sender._columns import ScalarRun
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1.wire import whole_records

STEPS = 300


def log_mixed(writer: SummaryWriter) -> None:
    """Scalars between histograms and texts, with fixed wall times so that two runs can be compared byte for byte."""
    values = np.linspace(-1.0, 1.0, 50)
    for step in range(STEPS):
        wall = 1_700_000_000.0 + step
        writer.add_scalar("loss", 1.0 / (step + 1), step, walltime=wall)
        writer.add_histogram("weights", values * step, step, walltime=wall)
        writer.add_scalar("acc", step / STEPS, step, walltime=wall)
        writer.add_scalar("lr", 0.1, step, walltime=wall)
        if step % 7 == 0:
            writer.add_text("note", f"step {step}", step, walltime=wall)


def records(daemon: Daemon, run: str) -> list[bytes]:
    [path] = event_files(daemon.logdir / run)
    assert_whole_records(path)
    return list(whole_records(path.read_bytes()))[1:]


@pytest.fixture
def column_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many scalars each columnar batch sent carried (the real stream sends them: this only counts)."""
    sent: list[int] = []
    original = _grpc_transport._Stream.write_scalars

    def counted(stream: _grpc_transport._Stream, first: int, scalars: ScalarRun, fixed_steps: bool = False) -> None:
        sent.append(len(scalars))
        original(stream, first, scalars, fixed_steps)

    monkeypatch.setattr(_grpc_transport._Stream, "write_scalars", counted)
    return sent


def older_daemon(monkeypatch: pytest.MonkeyPatch, *fields: str) -> None:
    """The client reads the answer of a daemon without `fields` (an older one; by default without
    `takes_scalar_columns` or `takes_fixed_steps`): those left out of the real answer, since no older daemon is
    at hand."""
    of = DaemonLimits.of

    def without(answer: pb.OpenSessionResponse) -> DaemonLimits:
        for field in fields or ("takes_scalar_columns", "takes_fixed_steps"):
            answer.ClearField(field)
        return of(answer)

    monkeypatch.setattr(DaemonLimits, "of", staticmethod(without))


def test_columns_keep_the_order_and_bytes_of_serialized_events(
    daemon: Daemon, column_batches: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logged to a daemon that takes columns with fixed steps, then as to older daemons (columns with varint
    steps; serialized events): the same records in the same order; only the first two sent columns."""
    writer = SummaryWriter("columns", address=daemon.address, worker="")
    log_mixed(writer)
    # Time enough to deliver the ~1,200 small batches live on a loaded machine: a close that runs out of time
    # spools the rest, which is replayed as events (a spool holds events), and this test is about what is sent live.
    assert writer.close(timeout=120).ok
    assert sum(column_batches) == 3 * STEPS
    with monkeypatch.context() as patch:
        older_daemon(patch, "takes_fixed_steps")
        writer = SummaryWriter("varint-steps", address=daemon.address, worker="")
        log_mixed(writer)
        assert writer.close(timeout=120).ok
    assert sum(column_batches) == 6 * STEPS
    older_daemon(monkeypatch)
    writer = SummaryWriter("events", address=daemon.address, worker="")
    log_mixed(writer)
    assert writer.close(timeout=120).ok
    assert sum(column_batches) == 6 * STEPS
    columns, varint, events = (records(daemon, run) for run in ("columns", "varint-steps", "events"))
    assert len(columns) == 4 * STEPS + len(range(0, STEPS, 7))
    assert columns == varint == events


@pytest.mark.parametrize(
    ("columns", "older"),
    [(True, ()), (True, ("takes_fixed_steps",)), (False, ("takes_scalar_columns", "takes_fixed_steps"))],
    ids=["fixed-steps", "varint-steps", "events"],
)
def test_a_step_beyond_int64_drops_that_scalar_alone(
    daemon: Daemon,
    monkeypatch: pytest.MonkeyPatch,
    columns: bool,
    older: tuple[str, ...],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A scalar no event carries (a step beyond int64, a tag that is not UTF-8: torch's writer raises on either)
    costs that scalar alone, counted and logged; the scalars around it, in the same batch, are delivered, and the
    sender goes on."""
    if older:
        older_daemon(monkeypatch, *older)
    writer = SummaryWriter(f"steps-{columns}", address=daemon.address, worker="")
    for step in (1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 3):
        writer.add_scalar("loss", float(step % 7), step, walltime=1_700_000_000.0)
    writer.add_scalar("lone \ud800 surrogate", 1.0, 3, walltime=1_700_000_000.0)
    writer.flush(timeout=30)
    writer.add_scalar("loss", 4.0, 4, walltime=1_700_000_000.0)
    report = writer.close()
    assert report.error is None and report.delivered == 5 and report.dropped == {"encode_error": 3}
    steps = [event.step for event in _events(daemon, f"steps-{columns}")]
    assert steps == [1, 2**63 - 1, -(2**63), 3, 4]
    assert "no event carries" in caplog.text or not columns


def _events(daemon: Daemon, run: str) -> list[event_pb2.Event]:
    return [event_pb2.Event.FromString(record) for record in records(daemon, run)]


def test_every_kind_of_tag_arrives_whether_add_scalar_knows_it_or_not(daemon: Daemon) -> None:
    """`add_scalar` takes the short way only for the short `str` tags it met, up to a bound: a tag met for the first
    time, one too long for the lock-free path, `bytes`, a `str` subclass and more distinct tags than the bound each
    arrive once, in order, under the tag they were logged with."""

    class Name(str):
        pass

    long_tag = "long/" + "x" * 300
    writer = SummaryWriter("tags", address=daemon.address, worker="")
    logged: list[tuple[str, int]] = []
    for step in range(3):
        for tag in ("loss", long_tag, b"bytes/tag", Name("sub/class")):
            writer.add_scalar(tag, float(step), step, walltime=1_700_000_000.0)
            logged.append((tag.decode() if isinstance(tag, bytes) else str(tag), step))
    for index in range(5000):  # past the 4,096 tags whose bytes a writer keeps
        writer.add_scalar(f"many/{index}", 1.0, 7, walltime=1_700_000_000.0)
        logged.append((f"many/{index}", 7))
    with pytest.raises(TypeError, match="tag must be a str"):
        writer.add_scalar(["not", "a", "tag"], 1.0, 0)  # type: ignore[arg-type]
    report = writer.close(timeout=120)
    assert report.ok and report.delivered == len(logged)
    assert [(event.summary.value[0].tag, event.step) for event in _events(daemon, "tags")] == logged
