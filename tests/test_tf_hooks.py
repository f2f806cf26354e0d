"""The hooks inside TensorFlow's `MonitoredTrainingSession`, with real `tensorflow-cpu`.

Parity: the same graph runs once under TensorFlow's own `SummarySaverHook` + `StepCounterHook` writing locally
and once under ours through a real daemon; TensorBoard's readers must find the same tags, steps, summary kinds,
values (rates aside), STARTs and graph. The graph orders the increment of the global step after the hooks' read
of it and after the summaries (TensorFlow itself leaves that order open, so the steps a hook sees would vary
from run to run): the saver then saves at 1, 9, 17, 25 and the step counter records at 11 and 21 over 30 steps.

TensorFlow is imported inside the tests only, so that collecting this module in the quick tier (without
TensorFlow installed) works.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto.event_pb2 import SessionLog
from tensorboard.compat.proto.graph_pb2 import GraphDef
from tensorboard.compat.proto.meta_graph_pb2 import MetaGraphDef
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.context import RequestContext

import summaryd.client
from _support import Daemon, event_files, read_events, start_daemon, unused_port
from summaryd.client import MonitoredLoop, SummaryWriter, SummaryWriterCache, create_global_step
from summaryd.client._api import _hooks

pytestmark = pytest.mark.slow

STEPS = 30
SAVER_STEPS = [1, 9, 17, 25]
COUNTER_STEPS = [11, 21]
RATE_TAG = "global_step/sec"
LAUNCHER_VARIABLES = ("TF_CONFIG", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
# TensorFlow's logs go to stderr; keep subprocess output to what the test prints.
QUIET_TF = {"TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.fixture(scope="module")
def tf() -> Any:
    import tensorflow

    return tensorflow


@pytest.fixture
def address(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Point the hooks' writers at the test daemon, as a single process."""
    monkeypatch.setenv("SUMMARYD_ADDRESS", daemon.address)
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield daemon.address
    SummaryWriterCache.clear()  # close the hooks' writers while the daemon is still up


@pytest.fixture
def tf_writers(tf: Any) -> Iterator[None]:
    """Close TensorFlow's cached `FileWriter`s after the test (its hooks' `end()` only flushes them)."""
    yield
    tf.compat.v1.summary.FileWriterCache.clear()


def train(
    tf: Any,
    make_hooks: Callable[[list[Any], Any], list[Any]],
    steps: int = STEPS,
    before_step: Callable[[int], None] | None = None,
    increment: int = 1,
) -> None:
    """Build the test graph, hand its summaries and scaffold to `make_hooks`, run `steps` steps that each add
    `increment` to the global step under `MonitoredTrainingSession` (whose exit calls the hooks' `end()`)."""
    from tensorflow.python.training import training_util

    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        # The tensor both hooks fetch (TensorFlow's hooks get it from this same function in `begin()`).
        read = training_util._get_or_create_global_step_read()
        x = tf.cast(read, tf.float32)
        summaries = [
            tf.compat.v1.summary.scalar("loss", 1.0 / (x + 1.0)),
            tf.compat.v1.summary.histogram("weights", tf.range(10.0) * x),
            tf.compat.v1.summary.image("sample", tf.fill([1, 2, 2, 3], tf.math.floormod(x, 8.0) / 8.0)),
            tf.compat.v1.summary.text("note", tf.strings.as_string(read)),
        ]
        with tf.control_dependencies([read, *summaries]):
            train_op = tf.compat.v1.assign_add(global_step, increment)
        scaffold = tf.compat.v1.train.Scaffold()
        hooks = make_hooks(summaries, scaffold)
        with tf.compat.v1.train.MonitoredTrainingSession(scaffold=scaffold, hooks=hooks) as session:
            for i in range(steps):
                if before_step is not None:
                    before_step(i)
                session.run(train_op)


@dataclass
class RunView:
    """One run's single event file, as TensorBoard's loader reads it."""

    starts: list[int] = field(default_factory=list)
    graphs: list[bytes] = field(default_factory=list)
    meta_graphs: list[bytes] = field(default_factory=list)
    kinds: dict[str, tuple[str, str]] = field(default_factory=dict)  # tag -> (value field, plugin) of 1st value
    values: dict[str, list[tuple[int, bytes]]] = field(default_factory=dict)  # tag -> (step, value sans metadata)
    other: list[str] = field(default_factory=list)

    def steps(self, tag: str) -> list[int]:
        return [step for step, _ in self.values.get(tag, [])]


def view(run_dir: Path) -> RunView:
    files = event_files(run_dir)
    assert len(files) == 1, f"expected one event file in {run_dir}, found {files}"
    events = read_events(files[0])
    assert events[0].file_version == "brain.Event:2"
    run = RunView()
    for event in events[1:]:
        what = event.WhichOneof("what")
        if what == "session_log" and event.session_log.status == SessionLog.START:
            run.starts.append(event.step)
        elif what == "graph_def":
            run.graphs.append(event.graph_def)
        elif what == "meta_graph_def":
            run.meta_graphs.append(event.meta_graph_def)
        elif what == "summary":
            for value in event.summary.value:
                run.kinds.setdefault(value.tag, (value.WhichOneof("value"), value.metadata.plugin_data.plugin_name))
                # TF's FileWriter keeps a tag's metadata on its first value only; compare the data itself.
                bare = Summary.Value()
                bare.CopyFrom(value)
                bare.ClearField("metadata")
                run.values.setdefault(value.tag, []).append((event.step, bare.SerializeToString()))
        else:
            run.other.append(str(what))
    return run


def nodes(graph: GraphDef) -> list[tuple[str, str, list[str], str]]:
    """A graph's nodes: name, op, inputs, device. (Function names inside `cond` carry a process-wide counter,
    so two builds of one graph never serialize to the same bytes.)"""
    return sorted((n.name, n.op, list(n.input), n.device) for n in graph.node)


def accumulator(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "histograms": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def tf_hooks(tf: Any, output_dir: Path, form: str) -> Callable[[list[Any], Any], list[Any]]:
    return lambda summaries, scaffold: [
        tf.compat.v1.train.SummarySaverHook(
            save_steps=8, output_dir=str(output_dir), **op(tf, form, summaries, scaffold)
        ),
        tf.compat.v1.train.StepCounterHook(every_n_steps=10, output_dir=str(output_dir)),
    ]


def our_hooks(tf: Any, run: str, form: str) -> Callable[[list[Any], Any], list[Any]]:
    return lambda summaries, scaffold: [
        summaryd.client.SummarySaverHook(save_steps=8, output_dir=run, **op(tf, form, summaries, scaffold)),
        summaryd.client.StepCounterHook(every_n_steps=10, output_dir=run),
    ]


def op(tf: Any, form: str, summaries: list[Any], scaffold: Any) -> dict[str, Any]:
    """The summary-op argument of each form a user may pass."""
    if form == "merged":
        return {"summary_op": tf.compat.v1.summary.merge_all()}
    if form == "list":
        return {"summary_op": summaries}
    return {"scaffold": scaffold}  # its summary_op: merge_all() when the session finalizes it


@pytest.mark.parametrize(
    "form, increment, saver_steps, counter_steps",
    [
        ("merged", 1, SAVER_STEPS, COUNTER_STEPS),
        ("list", 1, SAVER_STEPS, COUNTER_STEPS),
        ("scaffold", 1, SAVER_STEPS, COUNTER_STEPS),
        # The hooks read the real global step on trigger steps and count on from the stale one in between.
        ("merged", 3, [3, 15, 27, 39, 51, 63, 75, 87], [15, 27, 39, 51, 63, 75, 87]),
    ],
    ids=["summary_op", "list", "scaffold", "step+3"],
)
def test_parity_with_tensorflow_hooks_under_monitored_training_session(
    tf: Any,
    address: str,
    daemon: Daemon,
    tmp_path: Path,
    tf_writers: None,
    form: str,
    increment: int,
    saver_steps: list[int],
    counter_steps: list[int],
) -> None:
    """TF's hooks writing locally and ours through the daemon produce the same run, whatever the op's form."""
    local = tmp_path / "tf-local"
    train(tf, tf_hooks(tf, local, form), increment=increment)
    train(tf, our_hooks(tf, "parity", form), increment=increment)

    theirs, ours = view(local), view(daemon.logdir / "parity")
    assert ours.starts == theirs.starts == saver_steps[:1]
    assert set(ours.values) == set(theirs.values) == {"loss", "weights", "sample/image/0", "note", RATE_TAG}
    assert ours.kinds == theirs.kinds
    assert ours.kinds["note"] == ("tensor", "text")
    for tag in ("loss", "weights", "sample/image/0", "note"):
        assert ours.steps(tag) == theirs.steps(tag) == saver_steps, tag
        assert ours.values[tag] == theirs.values[tag], tag  # the Summary bytes travel unchanged
    assert ours.steps(RATE_TAG) == theirs.steps(RATE_TAG) == counter_steps
    # One writer per output_dir, which logged the graph once, as TF's FileWriter does.
    assert len(ours.graphs) == len(ours.meta_graphs) == 1
    assert len(theirs.graphs) == len(theirs.meta_graphs) == 1
    assert nodes(GraphDef.FromString(ours.graphs[0])) == nodes(GraphDef.FromString(theirs.graphs[0]))
    our_meta, their_meta = MetaGraphDef.FromString(ours.meta_graphs[0]), MetaGraphDef.FromString(theirs.meta_graphs[0])
    assert nodes(our_meta.graph_def) == nodes(their_meta.graph_def) == nodes(GraphDef.FromString(ours.graphs[0]))
    assert our_meta.meta_info_def.stripped_op_list == their_meta.meta_info_def.stripped_op_list
    assert ours.other == theirs.other == []

    ours_acc, theirs_acc = accumulator(daemon.logdir / "parity"), accumulator(local)
    assert ours_acc.Tags() == theirs_acc.Tags()
    assert ours_acc.Tags()["graph"] and ours_acc.Tags()["meta_graph"]
    assert nodes(ours_acc.Graph()) == nodes(theirs_acc.Graph())
    # The summaries read the global step before the run's increment.
    expected_loss = [(s, pytest.approx(1 / (s - increment + 1))) for s in saver_steps]
    assert [(s.step, s.value) for s in ours_acc.Scalars("loss")] == expected_loss


def test_hooks_are_tensorflow_hooks_imported_lazily() -> None:
    """`import summaryd.client` leaves TensorFlow alone; the hooks, once touched, are TensorFlow subclasses."""
    script = """
import sys
import summaryd.client
from summaryd.client import MonitoredLoop, SummaryWriter, SummaryWriterCache, hooks, writer
assert "tensorflow" not in sys.modules, "importing summaryd.client imported tensorflow"
saver, counter = summaryd.client.SummarySaverHook, summaryd.client.StepCounterHook
assert "tensorflow" in sys.modules
import tensorflow as tf
from summaryd.client.hooks import PlainStepCounterHook, PlainSummarySaverHook
assert issubclass(saver, tf.compat.v1.train.SessionRunHook) and issubclass(saver, PlainSummarySaverHook)
assert issubclass(counter, tf.compat.v1.train.SessionRunHook) and issubclass(counter, PlainStepCounterHook)
assert saver is hooks.SummarySaverHook and counter is hooks.StepCounterHook
from summaryd.client import SummarySaverHook
assert SummarySaverHook is saver
print("ok")
"""
    env = {**os.environ, **QUIET_TF}
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_tensorflow_hooks_still_drive_a_plain_loop(tf: Any, address: str, daemon: Daemon) -> None:
    """Executing eagerly (no graph), the TensorFlow classes keep the plain hooks' behaviour under `MonitoredLoop`,
    with the global step of `create_global_step()` and no graph event."""
    saver = summaryd.client.SummarySaverHook(save_steps=8, output_dir="plain", summary_op=lambda: {"loss": 0.5})
    counter = summaryd.client.StepCounterHook(every_n_steps=10, output_dir="plain")
    assert isinstance(saver, tf.compat.v1.train.SessionRunHook) and tf.executing_eagerly()
    global_step = create_global_step()
    with MonitoredLoop([saver, counter]) as loop:
        for _ in range(STEPS):
            loop.run(global_step.increment)

    run = view(daemon.logdir / "plain")
    assert run.starts == [1]
    assert run.steps("loss") == SAVER_STEPS
    assert run.steps(RATE_TAG) == COUNTER_STEPS
    assert run.graphs == run.meta_graphs == []


def test_constructor_signatures_match_tensorflow(tf: Any) -> None:
    """Same parameter names, order, kinds and defaults as TensorFlow's hooks (a drop-in by import)."""

    def shape(cls: type) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(cls.__init__).parameters.values()]

    assert shape(summaryd.client.SummarySaverHook) == shape(tf.compat.v1.train.SummarySaverHook)
    assert shape(summaryd.client.StepCounterHook) == shape(tf.compat.v1.train.StepCounterHook)


def test_run_args_and_values_have_tensorflows_fields(tf: Any) -> None:
    """The plain loop's `SessionRunArgs`/`SessionRunValues` take positional arguments in TensorFlow's order."""
    assert summaryd.client.SessionRunArgs._fields == tf.compat.v1.train.SessionRunArgs._fields
    assert summaryd.client.SessionRunValues._fields == tf.compat.v1.train.SessionRunValues._fields


def test_before_run_asks_for_the_global_step_and_on_trigger_the_summaries(tf: Any, address: str) -> None:
    """`before_run` answers with TensorFlow's `SessionRunArgs`: the global-step read TensorFlow's hooks use and,
    on a trigger step only, the summary ops as a list; the step counter asks for the global step alone."""
    from tensorflow.python.training import training_util

    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        summary = tf.compat.v1.summary.scalar("x", tf.constant(1.0))
        saver = summaryd.client.SummarySaverHook(save_steps=8, output_dir="asks", summary_op=summary)
        counter = summaryd.client.StepCounterHook(every_n_steps=10, output_dir="asks")
        saver.begin()
        counter.begin()
        read = training_util._get_or_create_global_step_read()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            context = tf.compat.v1.train.SessionRunContext(tf.compat.v1.train.SessionRunArgs(None), session)

            first = saver.before_run(context)
            assert isinstance(first, tf.compat.v1.train.SessionRunArgs)
            assert first.fetches == {"global_step": read, "summary": [summary]}
            saver.after_run(context, tf.compat.v1.train.SessionRunValues(session.run(first.fetches), None, None))
            # The global step stayed at 0, so the next step (1) is not a trigger step: no summary fetched.
            second = saver.before_run(context)
            assert isinstance(second, tf.compat.v1.train.SessionRunArgs)
            assert second.fetches == {"global_step": read}

            assert counter.before_run(context) == tf.compat.v1.train.SessionRunArgs(read)
            assert isinstance(counter.before_run(context), tf.compat.v1.train.SessionRunArgs)


def test_step_counter_tag_follows_the_global_step_name(
    tf: Any, address: str, daemon: Daemon, tmp_path: Path, tf_writers: None
) -> None:
    """TensorFlow names the rate after the global step variable (`<name>/sec`); so do we."""

    def run(hook_class: Any, output_dir: str) -> None:
        with tf.Graph().as_default():
            step = tf.compat.v1.get_variable(
                "my_step",
                shape=[],
                dtype=tf.int64,
                initializer=tf.compat.v1.zeros_initializer(),
                trainable=False,
                collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.GLOBAL_STEP],
            )
            train_op = tf.compat.v1.assign_add(step, 1)
            with tf.compat.v1.train.MonitoredTrainingSession(
                hooks=[hook_class(every_n_steps=1, output_dir=output_dir)]
            ) as session:
                for _ in range(3):
                    session.run(train_op)

    run(tf.compat.v1.train.StepCounterHook, str(tmp_path / "local"))
    tf.compat.v1.summary.FileWriterCache.clear()  # TF's StepCounterHook.end() does not flush its writer
    run(summaryd.client.StepCounterHook, "named")
    assert set(view(daemon.logdir / "named").values) == set(view(tmp_path / "local").values) == {"my_step/sec"}


BAD_ARGUMENTS = {
    "saver: neither scaffold nor summary_op": ("SummarySaverHook", {"save_steps": 8}),
    "saver: both scaffold and summary_op": ("SummarySaverHook", {"save_steps": 8, "scaffold": 1, "summary_op": 1}),
    "saver: no interval": ("SummarySaverHook", {"summary_op": 1}),
    "saver: both intervals": ("SummarySaverHook", {"save_steps": 8, "save_secs": 10, "summary_op": 1}),
    "counter: both intervals": ("StepCounterHook", {"every_n_steps": 10, "every_n_secs": 5}),
    "counter: no interval": ("StepCounterHook", {"every_n_steps": None}),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_argument_errors_are_tensorflows(tf: Any, case: str) -> None:
    """Each bad argument combination raises what TensorFlow's own hook raises, type and message."""
    name, kwargs = BAD_ARGUMENTS[case]
    with pytest.raises(Exception) as theirs:
        getattr(tf.compat.v1.train, name)(**kwargs)
    with pytest.raises(Exception) as ours:
        getattr(summaryd.client, name)(**kwargs)
    assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value))


@pytest.mark.parametrize("name", ["SummarySaverHook", "StepCounterHook"])
def test_begin_without_global_step_raises_tensorflows_error(
    tf: Any, address: str, tmp_path: Path, tf_writers: None, name: str
) -> None:
    """In a graph without a global step, `MonitoredTrainingSession` fails in `begin()` exactly as with TF's hook."""

    def start(hook_class: Any, output_dir: str) -> str:
        with tf.Graph().as_default():
            summary = tf.compat.v1.summary.scalar("x", tf.constant(1.0))
            kwargs = {"save_steps": 1, "summary_op": summary} if name == "SummarySaverHook" else {}
            hook = hook_class(output_dir=output_dir, **kwargs)
            with pytest.raises(RuntimeError) as raised:
                tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook])
            assert type(raised.value) is RuntimeError
            return str(raised.value)

    theirs = start(getattr(tf.compat.v1.train, name), str(tmp_path / "local"))
    assert start(getattr(summaryd.client, name), "no-step") == theirs == f"Global step should be created to use {name}."


class FakeClock:
    """A clock that moves only when the test says so; stands in for `time.time`."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_save_secs_and_every_n_secs_follow_the_clock_like_tensorflow(
    tf: Any, address: str, daemon: Daemon, tmp_path: Path, tf_writers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one controlled clock for both, TF's hooks and ours save and count at the same steps and rates.

    `save_secs=10` fires on the first step and then once 10 s have passed: the clock moves by 10 s before
    step 6, 9 s before step 7, 1 s before step 8 and 0.5 s before step 9, so summaries land at 1, 6 and 8.
    """
    from tensorflow.python.training import basic_session_run_hooks

    clock = FakeClock()
    monkeypatch.setattr(_hooks, "clock", clock)  # our hooks' timer
    monkeypatch.setattr(basic_session_run_hooks, "time", types.SimpleNamespace(time=clock))  # TF's timer
    advance = {5: 10.0, 6: 9.0, 7: 1.0, 8: 0.5}

    def tick(i: int) -> None:
        clock.now += advance.get(i, 0.0)

    local = tmp_path / "tf-local"
    train(
        tf,
        lambda summaries, _: [
            tf.compat.v1.train.SummarySaverHook(save_secs=10, output_dir=str(local), summary_op=summaries[0]),
            tf.compat.v1.train.StepCounterHook(every_n_steps=None, every_n_secs=10, output_dir=str(local)),
        ],
        steps=10,
        before_step=tick,
    )
    train(
        tf,
        lambda summaries, _: [
            summaryd.client.SummarySaverHook(save_secs=10, output_dir="timed", summary_op=summaries[0]),
            summaryd.client.StepCounterHook(every_n_steps=None, every_n_secs=10, output_dir="timed"),
        ],
        steps=10,
        before_step=tick,
    )

    theirs, ours = view(local), view(daemon.logdir / "timed")
    assert ours.steps("loss") == theirs.steps("loss") == [1, 6, 8]
    assert ours.values["loss"] == theirs.values["loss"]
    # Rates on a controlled clock are exact: 5 steps in 10 s at step 6, 2 steps in 10 s at step 8.
    assert ours.values[RATE_TAG] == theirs.values[RATE_TAG]
    acc = accumulator(daemon.logdir / "timed")
    assert [(s.step, s.value) for s in acc.Scalars(RATE_TAG)] == [(6, 0.5), (8, pytest.approx(0.2))]
    assert ours.starts == theirs.starts == [1]


def test_explicit_summary_writer_receives_the_summaries_without_a_graph(tf: Any, address: str, daemon: Daemon) -> None:
    """`summary_writer=SummaryWriter(run)` is used as TF uses a passed writer: summaries, START, no graph. The
    writer holds a partial batch for 2 s, longer than the training takes, so only the hooks' `end()` (a flush
    that waits for the daemon) can have put the last events on disk when the session exits."""
    writer = SummaryWriter("explicit", linger_secs=2)
    try:
        train(
            tf,
            lambda summaries, _: [
                summaryd.client.SummarySaverHook(save_steps=8, summary_writer=writer, summary_op=summaries[0]),
                summaryd.client.StepCounterHook(every_n_steps=10, summary_writer=writer),
            ],
        )
        run = view(daemon.logdir / "explicit")
    finally:
        writer.close()
    assert run.starts == [1]
    assert run.steps("loss") == SAVER_STEPS
    assert run.steps(RATE_TAG) == COUNTER_STEPS
    assert run.graphs == run.meta_graphs == []


def test_a_tensorflow_file_writer_logs_through_summaryd_under_its_mapped_logdir(
    tf: Any, address: str, daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`summary_writer=tf.compat.v1.summary.FileWriter(logdir)`, as TF1 code builds it: the hooks log through the
    daemon to the run that logdir maps to (below the working directory: its relative path; below the run root),
    as TensorFlow's hooks log to a writer passed in: summaries, START, no graph."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SUMMARYD_RUN_ROOT", "tf1")
    with tf.Graph().as_default():
        file_writer = tf.compat.v1.summary.FileWriter(str(tmp_path / "logs" / "train"))
    try:
        train(
            tf,
            lambda summaries, _: [
                summaryd.client.SummarySaverHook(save_steps=8, summary_writer=file_writer, summary_op=summaries[0]),
                summaryd.client.StepCounterHook(every_n_steps=10, summary_writer=file_writer),
            ],
        )
    finally:
        file_writer.close()
    run = view(daemon.logdir / "tf1" / "logs" / "train")
    assert run.steps("loss") == SAVER_STEPS
    assert run.steps(RATE_TAG) == COUNTER_STEPS
    assert run.starts == [1]
    assert run.graphs == run.meta_graphs == []


# One worker of a two-worker TensorFlow cluster (between-graph replication): the global step lives on the chief
# (task 0); each worker runs its own `MonitoredTrainingSession` with our hooks on `output_dir="multi"`. The chief
# initializes, trains and reports "trained", then keeps its server (and the global step) up until told to exit.
WORKER_SCRIPT = r"""
import json, os, sys
import tensorflow as tf
from tensorflow.python.training import training_util
from summaryd.client import StepCounterHook, SummarySaverHook

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
cluster = tf.train.ClusterSpec(json.loads(os.environ["TF_CONFIG"])["cluster"])
server = tf.distribute.Server(cluster, job_name="worker", task_index=task)
with tf.Graph().as_default():
    with tf.device("/job:worker/task:0"):
        global_step = tf.compat.v1.train.get_or_create_global_step()
    with tf.device(f"/job:worker/task:{task}"):
        read = training_util._get_or_create_global_step_read()
        loss = tf.compat.v1.summary.scalar("loss", 1.0 / (tf.cast(read, tf.float32) + 1.0))
        with tf.control_dependencies([read, loss]):
            train_op = tf.compat.v1.assign_add(global_step, 1)
    hooks = [SummarySaverHook(save_steps=8, output_dir="multi", summary_op=loss),
             StepCounterHook(every_n_steps=10, output_dir="multi")]
    config = tf.compat.v1.ConfigProto(device_filters=["/job:worker/task:0", f"/job:worker/task:{task}"])
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target, is_chief=task == 0, hooks=hooks, config=config
    ) as session:
        for _ in range(int(sys.argv[1])):
            session.run(train_op)
print("trained", flush=True)
if task == 0:
    sys.stdin.readline()
"""


def test_chief_and_non_chief_land_in_their_own_worker_runs(daemons: list[Daemon], tmp_path: Path) -> None:
    """Two worker processes of one TF cluster, chief then non-chief, write `multi/worker-0` and `multi/worker-1`,
    and TensorBoard's data provider serves both runs."""
    # The workers' own runs only: a daemon that does not add the cross-worker aggregates beside them.
    daemon = start_daemon(tmp_path, "--no-aggregate")
    daemons.append(daemon)
    cluster = {"worker": [f"127.0.0.1:{unused_port()}", f"127.0.0.1:{unused_port()}"]}
    procs: list[subprocess.Popen[str]] = []

    def start(task: int) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
        env.update(QUIET_TF, SUMMARYD_ADDRESS=daemon.address)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": task}})
        with open(tmp_path / f"worker-{task}.err", "w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", WORKER_SCRIPT, str(STEPS)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )
        procs.append(proc)
        return proc

    def errors() -> str:
        return "\n".join(p.read_text()[-3000:] for p in sorted(tmp_path.glob("worker-*.err")))

    try:
        chief = start(0)
        assert chief.stdout is not None and chief.stdin is not None
        assert chief.stdout.readline().strip() == "trained", errors()
        # The chief has initialized the global step and trained; the non-chief now finds the model ready.
        other = start(1)
        out, _ = other.communicate(timeout=90)
        assert other.returncode == 0 and out.strip() == "trained", errors()
        chief.stdin.write("exit\n")
        chief.stdin.flush()
        assert chief.wait(timeout=30) == 0, errors()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()

    chief_run, other_run = view(daemon.logdir / "multi" / "worker-0"), view(daemon.logdir / "multi" / "worker-1")
    assert event_files(daemon.logdir / "multi") == []
    assert chief_run.starts == [1]
    assert chief_run.steps("loss") == SAVER_STEPS
    assert chief_run.steps(RATE_TAG) == COUNTER_STEPS
    # The non-chief starts where the chief left the shared global step.
    assert other_run.starts == [STEPS + 1]
    assert other_run.steps("loss") == [STEPS + s for s in SAVER_STEPS]
    assert other_run.steps(RATE_TAG) == [STEPS + s for s in COUNTER_STEPS]
    assert len(chief_run.graphs) == len(other_run.graphs) == 1

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(daemon.logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(daemon.logdir))
    served = provider.read_scalars(
        RequestContext(), experiment_id="", plugin_name="scalars", downsample=1000, run_tag_filter=None
    )
    assert sorted(served) == ["multi/worker-0", "multi/worker-1"]
    for run, first in (("multi/worker-0", 0), ("multi/worker-1", STEPS)):
        assert set(served[run]) == {"loss", RATE_TAG}
        points = served[run]["loss"]
        assert [p.step for p in points] == [first + s for s in SAVER_STEPS]
        assert [p.value for p in points] == pytest.approx([1 / (first + s) for s in SAVER_STEPS])
