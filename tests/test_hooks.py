"""`SummarySaverHook` and `StepCounterHook` against a real daemon, read back with
TensorBoard's own readers.

Every loop runs 30 steps of a global step created at 0 that the step function increments, as a
`tf.compat.v1.train.MonitoredSession` with `assign_add(global_step, 1)` does. TensorFlow 2.21 writes, for that
loop, `START` at 1, `save_steps=8` summaries at 1, 9, 17, 25 and `StepCounterHook(every_n_steps=10)` rates at
11 and 21; the argument-error messages below were captured from `tensorflow-cpu==2.21.0`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary

from _support import Daemon, event_files, read_events
from summaryd.client import (
    MonitoredLoop,
    SecondOrStepTimer,
    SessionRunHook,
    StepCounterHook,
    SummarySaverHook,
    SummaryWriter,
    create_global_step,
)
from summaryd.client._api import _hooks
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

STEPS = 30
SAVER_STEPS = [1, 9, 17, 25]
COUNTER_STEPS = [11, 21]
# What would make the client write to `<run>/<worker>` instead of `<run>`.
LAUNCHER_VARIABLES = ("TF_CONFIG", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")


@pytest.fixture
def address(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point hook writers (created through `SummaryWriterCache`) at the test daemon, as a single process."""
    monkeypatch.setenv("SUMMARYD_ADDRESS", daemon.address)
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return daemon.address


def train(hooks: list[SessionRunHook], steps: int = STEPS) -> None:
    """Create the global step at 0 and run `steps` steps that increment it; exiting the loop calls `end()`."""
    global_step = create_global_step()
    with MonitoredLoop(hooks) as loop:
        for _ in range(steps):
            loop.run(global_step.increment)


def only_event_file(run_dir: Path) -> list[Event]:
    """The events of the run's single event file (asserting there is exactly one)."""
    files = event_files(run_dir)
    assert len(files) == 1, f"expected one event file in {run_dir}, found {files}"
    events = read_events(files[0])
    assert events[0].file_version == "brain.Event:2"
    return events


def steps_of(events: list[Event], tag: str) -> list[int]:
    return [e.step for e in events for v in e.summary.value if v.tag == tag]


def starts(events: list[Event]) -> list[int]:
    return [e.step for e in events if e.HasField("session_log") and e.session_log.status == SessionLog.START]


def scalar_summary(tag: str, value: float) -> Summary:
    return Summary(value=[Summary.Value(tag=tag, simple_value=value)])


class Scaffold:
    """What the hook reads from `scaffold=`: an object with a `summary_op`."""

    def __init__(self, summary_op: Any) -> None:
        self.summary_op = summary_op


# Each form of summary op a user may pass, and the scalars (tag -> value) it saves at every trigger.
SUMMARY_OPS: dict[str, tuple[Callable[[], dict[str, Any]], dict[str, float]]] = {
    "Summary": (lambda: {"summary_op": lambda: scalar_summary("loss", 0.5)}, {"loss": 0.5}),
    "bytes": (lambda: {"summary_op": lambda: scalar_summary("loss", 0.25).SerializeToString()}, {"loss": 0.25}),
    "mapping": (lambda: {"summary_op": lambda: {"loss": 2, "accuracy": 0.75}}, {"loss": 2.0, "accuracy": 0.75}),
    "list": (
        lambda: {"summary_op": [lambda: scalar_summary("loss", 1.5), lambda: {"lr": 0.125}]},
        {"loss": 1.5, "lr": 0.125},
    ),
    "scaffold": (lambda: {"scaffold": Scaffold(lambda: {"loss": 3.0})}, {"loss": 3.0}),
}


@pytest.mark.parametrize("form", SUMMARY_OPS)
def test_saver_hook_saves_at_steps_1_9_17_25_with_one_start(address: str, daemon: Daemon, form: str) -> None:
    """`save_steps=8` over 30 steps saves at 1, 9, 17, 25 and logs START once, whatever form the op takes."""
    make_kwargs, expected = SUMMARY_OPS[form]
    train([SummarySaverHook(save_steps=8, output_dir="hooked", **make_kwargs())])

    events = only_event_file(daemon.logdir / "hooked")
    assert starts(events) == [1]
    for tag in expected:
        assert steps_of(events, tag) == SAVER_STEPS, tag
    assert {v.tag for e in events for v in e.summary.value} == set(expected)

    accumulator = EventAccumulator(str(daemon.logdir / "hooked"))
    accumulator.Reload()
    assert sorted(accumulator.Tags()["scalars"]) == sorted(expected)
    for tag, value in expected.items():
        points = accumulator.Scalars(tag)
        assert [p.step for p in points] == SAVER_STEPS
        assert [p.value for p in points] == [value] * len(SAVER_STEPS)


def test_step_counter_hook_writes_rate_at_11_and_21(address: str, daemon: Daemon) -> None:
    """`every_n_steps=10` over 30 steps records `global_step/sec` at 11 and 21, not at the first step."""
    train([StepCounterHook(every_n_steps=10, output_dir="counted")])

    events = only_event_file(daemon.logdir / "counted")
    assert steps_of(events, "global_step/sec") == COUNTER_STEPS
    rates = [v.simple_value for e in events for v in e.summary.value]
    assert all(rate > 0 for rate in rates), rates
    assert starts(events) == []


def test_hooks_naming_one_output_dir_share_one_writer(address: str, daemon: Daemon) -> None:
    """Two hooks on the same `output_dir` use one writer: one daemon session, one file holding both."""
    train(
        [
            SummarySaverHook(save_steps=8, output_dir="shared", summary_op=lambda: {"loss": 1.0}),
            StepCounterHook(every_n_steps=10, output_dir="shared"),
        ]
    )

    with grpc.insecure_channel(address) as channel:
        status = pb_grpc.SummariesStub(channel).GetStatus(pb.GetStatusRequest(), timeout=10)
    assert [s.run_dir for s in status.sessions] == ["shared"]

    events = only_event_file(daemon.logdir / "shared")
    assert starts(events) == [1]
    assert steps_of(events, "loss") == SAVER_STEPS
    assert steps_of(events, "global_step/sec") == COUNTER_STEPS
    assert [e.step for e in events[1:]] == sorted(e.step for e in events[1:])


@pytest.mark.parametrize(
    "make_hook, tag, steps",
    [
        (
            lambda: SummarySaverHook(save_steps=1, output_dir="flushed", summary_op=lambda: {"x": 1.0}),
            "x",
            list(range(1, STEPS + 1)),
        ),
        (lambda: StepCounterHook(every_n_steps=1, output_dir="flushed"), "global_step/sec", list(range(2, STEPS + 1))),
    ],
    ids=["SummarySaverHook", "StepCounterHook"],
)
def test_end_flushes_events_to_the_file(
    address: str, daemon: Daemon, make_hook: Callable[[], SessionRunHook], tag: str, steps: list[int]
) -> None:
    """Right after `MonitoredLoop.close()` (the hooks' `end()`), every event is readable in the file."""
    global_step = create_global_step()
    loop = MonitoredLoop([make_hook()])
    for _ in range(STEPS):
        loop.run(global_step.increment)
    loop.close()

    assert steps_of(only_event_file(daemon.logdir / "flushed"), tag) == steps


class FakeClock:
    """A clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_save_secs_triggers_on_first_step_then_every_10_seconds(
    address: str, daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`save_secs=10` saves on the first step, then only once 10 s have passed on the hooks' clock."""
    fake = FakeClock()
    monkeypatch.setattr(_hooks, "clock", fake)
    global_step = create_global_step()
    # Seconds to advance the clock before each of 10 steps (the step that then runs is step i + 1).
    advance = {5: 10.0, 6: 9.0, 7: 1.0, 8: 0.5}
    with MonitoredLoop([SummarySaverHook(save_secs=10, output_dir="timed", summary_op=lambda: {"x": 1})]) as loop:
        for i in range(10):
            fake.now += advance.get(i, 0.0)
            loop.run(global_step.increment)

    events = only_event_file(daemon.logdir / "timed")
    assert steps_of(events, "x") == [1, 6, 8]
    assert starts(events) == [1]


def test_explicit_summary_writer_is_used(address: str, daemon: Daemon) -> None:
    """A `summaryd.client.SummaryWriter` passed as `summary_writer` receives the hook's summaries."""
    writer = SummaryWriter("explicit")
    try:
        train([SummarySaverHook(save_steps=8, summary_writer=writer, summary_op=lambda: {"loss": 1.0})])
        events = only_event_file(daemon.logdir / "explicit")
        assert steps_of(events, "loss") == SAVER_STEPS
        assert starts(events) == [1]
    finally:
        writer.close()


class FileWriter:
    """Stands in for a writer of another library (TF's `FileWriter`, torch's `SummaryWriter`)."""

    def add_summary(self, summary: Any, global_step: int | None = None) -> None:
        raise AssertionError("a foreign writer must be refused, not used")


@pytest.mark.parametrize(
    "make_hook",
    [
        lambda w: SummarySaverHook(save_steps=8, summary_writer=w, summary_op=lambda: {"loss": 1.0}),
        lambda w: StepCounterHook(every_n_steps=10, summary_writer=w),
    ],
    ids=["SummarySaverHook", "StepCounterHook"],
)
def test_foreign_summary_writer_is_refused_with_what_to_pass(make_hook: Callable[[Any], SessionRunHook]) -> None:
    """A `summary_writer` that is not ours raises TypeError naming what to pass instead."""
    create_global_step()
    with pytest.raises(TypeError) as raised:
        MonitoredLoop([make_hook(FileWriter())])
    message = str(raised.value)
    assert f"summary_writer is a {FileWriter.__module__}.FileWriter" in message
    assert "pass a summaryd.client.SummaryWriter" in message


# Exception types and messages of TensorFlow 2.21's `tf.compat.v1.train` hooks and `SecondOrStepTimer`.
SCAFFOLD_OR_OP = "Exactly one of scaffold or summary_op must be provided."
NO_INTERVAL = "Either every_secs or every_steps should be provided."
BOTH_INTERVALS = "Can not provide both every_secs and every_steps."
COUNTER_INTERVALS = "exactly one of every_n_steps and every_n_secs should be provided."


def _op() -> dict[str, float]:
    return {"loss": 1.0}


ARGUMENT_ERRORS: dict[str, tuple[Callable[[], object], str]] = {
    "saver: neither scaffold nor summary_op": (lambda: SummarySaverHook(save_steps=8), SCAFFOLD_OR_OP),
    "saver: both scaffold and summary_op": (
        lambda: SummarySaverHook(save_steps=8, scaffold=Scaffold(_op), summary_op=_op),
        SCAFFOLD_OR_OP,
    ),
    "saver: neither save_steps nor save_secs": (lambda: SummarySaverHook(summary_op=_op), NO_INTERVAL),
    "saver: both save_steps and save_secs": (
        lambda: SummarySaverHook(save_steps=8, save_secs=10, summary_op=_op),
        BOTH_INTERVALS,
    ),
    "timer: neither": (SecondOrStepTimer, NO_INTERVAL),
    "timer: both": (lambda: SecondOrStepTimer(every_secs=1, every_steps=1), BOTH_INTERVALS),
    "counter: both": (lambda: StepCounterHook(every_n_steps=10, every_n_secs=5), COUNTER_INTERVALS),
    "counter: neither": (lambda: StepCounterHook(every_n_steps=None, every_n_secs=None), COUNTER_INTERVALS),
}


@pytest.mark.parametrize("case", ARGUMENT_ERRORS)
def test_argument_errors_match_tensorflow(case: str) -> None:
    """Bad constructor arguments raise TensorFlow's exception type with TensorFlow's exact message."""
    construct, message = ARGUMENT_ERRORS[case]
    with pytest.raises(ValueError) as raised:
        construct()
    assert type(raised.value) is ValueError
    assert str(raised.value) == message


@pytest.mark.parametrize(
    "hook, message",
    [
        (
            lambda: SummarySaverHook(save_steps=8, summary_op=_op),
            "Global step should be created to use SummarySaverHook.",
        ),
        (lambda: StepCounterHook(every_n_steps=10), "Global step should be created to use StepCounterHook."),
    ],
    ids=["SummarySaverHook", "StepCounterHook"],
)
def test_begin_without_global_step_raises_like_tensorflow(hook: Callable[[], SessionRunHook], message: str) -> None:
    """Starting a loop before `create_global_step()` raises TensorFlow's RuntimeError and message."""
    with pytest.raises(RuntimeError) as raised:
        MonitoredLoop([hook()])
    assert type(raised.value) is RuntimeError
    assert str(raised.value) == message
