"""The hooks and their loop without TensorFlow: `PlainSummarySaverHook`, `PlainStepCounterHook`, `MonitoredLoop`.

`summaryd.client.hooks` is their public face (and picks the TensorFlow subclasses of `_tf` when TensorFlow is
installed); `_tf` builds on these, so neither imports the public module back.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, ClassVar, NamedTuple

from tensorboard.compat.proto.event_pb2 import SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary

from summaryd.client.writer import SummaryWriter
from summaryd.v1.runpath import run_dir_parts

log = logging.getLogger("summaryd.client")

# The clock of the hooks' timers; tests replace it to make `save_secs` deterministic.
clock: Callable[[], float] = time.time


class SessionRunArgs(NamedTuple):
    """What a hook asks the next run to compute (TensorFlow's `SessionRunArgs`, fields in its order)."""

    fetches: Any
    feed_dict: Any = None
    options: Any = None


class SessionRunValues(NamedTuple):
    """The results of the fetches a hook asked for (TensorFlow's `SessionRunValues`)."""

    results: Any
    options: Any = None
    run_metadata: Any = None


class SessionRunContext:
    """The run a hook is called around (TensorFlow's `SessionRunContext`)."""

    def __init__(self, original_args: SessionRunArgs, session: Any) -> None:
        self.original_args = original_args
        self.session = session
        self._stop_requested = False

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    def request_stop(self) -> None:
        self._stop_requested = True


class SessionRunHook:
    """The hook lifecycle of `tf.compat.v1.train.SessionRunHook`; every method does nothing by default."""

    def begin(self) -> None:
        """Called once before the session is used."""

    def after_create_session(self, session: Any, coord: Any) -> None:
        """Called when the session has been created."""

    def before_run(self, run_context: SessionRunContext) -> SessionRunArgs | None:
        """Called before each run; may return fetches to add to it."""
        return None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """Called after each run with the results of the fetches asked for in `before_run`."""

    def end(self, session: Any) -> None:
        """Called at the end of the session."""


class GlobalStep:
    """The global step of a loop without TensorFlow: the training step increments it."""

    def __init__(self, value: int = 0) -> None:
        self._value = int(value)
        self._lock = threading.Lock()

    @property
    def value(self) -> int:
        return self._value

    def increment(self, by: int = 1) -> int:
        """Add `by` and return the new value."""
        with self._lock:
            self._value += by
            return self._value


_global_step: GlobalStep | None = None


def create_global_step(value: int = 0) -> GlobalStep:
    """Create the process's global step (as `tf.compat.v1.train.create_global_step` does for a graph)."""
    global _global_step
    _global_step = GlobalStep(value)
    return _global_step


def get_global_step() -> GlobalStep | None:
    """The global step created by `create_global_step`, or None."""
    return _global_step


def reset_global_step() -> None:
    """Forget the global step (a new "graph")."""
    global _global_step
    _global_step = None


class LoopSession:
    """The `session` of a `MonitoredLoop`: `run(fetches)` evaluates a `GlobalStep` or callables in place."""

    def run(self, fetches: Any) -> Any:
        return _evaluate(fetches, None)


def _evaluate(fetches: Any, global_step_value: int | None) -> Any:
    if isinstance(fetches, GlobalStep):
        return fetches.value if global_step_value is None else global_step_value
    if isinstance(fetches, Mapping):
        return {key: _evaluate(value, global_step_value) for key, value in fetches.items()}
    if isinstance(fetches, list | tuple):
        return type(fetches)(_evaluate(value, global_step_value) for value in fetches)
    if callable(fetches):
        return fetches()
    return fetches


class MonitoredLoop:
    """Drives hooks around a plain Python training step, the way `MonitoredTrainingSession` does.

    ```
    step = create_global_step()
    with MonitoredLoop([SummarySaverHook(save_steps=100, output_dir="exp", summary_op=summaries)]) as loop:
        for batch in data:
            loop.run(lambda: train(batch, step))   # the step function increments `step`
    ```

    The hooks' global-step fetches are read before the step runs (TensorFlow's "stale" value); other fetches
    are evaluated after it.
    """

    def __init__(self, hooks: Iterable[SessionRunHook], global_step: GlobalStep | None = None) -> None:
        self.hooks = list(hooks)
        self.session = LoopSession()
        self._global_step = global_step
        self._stop = False
        for hook in self.hooks:
            hook.begin()
        for hook in self.hooks:
            hook.after_create_session(self.session, None)

    def should_stop(self) -> bool:
        """True once a hook called `run_context.request_stop()`."""
        return self._stop

    def run(self, step_fn: Callable[[], Any]) -> Any:
        """Run one step between the hooks' `before_run` and `after_run`; return what `step_fn` returned."""
        global_step = self._global_step or get_global_step()
        stale = global_step.value if global_step is not None else None
        context = SessionRunContext(SessionRunArgs(step_fn), self.session)
        requests = [hook.before_run(context) for hook in self.hooks]
        result = step_fn()
        for hook, request in zip(self.hooks, requests, strict=True):
            results = _evaluate(request.fetches, stale) if request is not None else None
            hook.after_run(context, SessionRunValues(results=results))
        self._stop = self._stop or context.stop_requested
        return result

    def close(self) -> None:
        for hook in self.hooks:
            hook.end(self.session)

    def __enter__(self) -> MonitoredLoop:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class SummaryWriterCache:
    """One shared `SummaryWriter` per output directory (TensorFlow's `SummaryWriterCache`)."""

    _lock = threading.Lock()
    _writers: ClassVar[dict[str, SummaryWriter]] = {}

    @classmethod
    def get(cls, logdir: str, graph: Any = None) -> SummaryWriter:
        """The writer of run `logdir`, created on first use.

        Args:
            logdir: run path under the daemon's logdir.
            graph: a TensorFlow `Graph`; a writer created by this call first logs its `graph_def` and
                `meta_graph_def` events, as TensorFlow's cache does with the default graph (the TensorFlow hooks
                pass it). Ignored when the writer exists.
        """
        with cls._lock:
            writer = cls._writers.get(logdir)
            if writer is None:
                writer = cls._writers[logdir] = SummaryWriter(logdir, framework="summaryd-hooks")
                if graph is not None:
                    from summaryd.client._api import _tf  # a graph means TensorFlow is imported already

                    for event in _tf.graph_events(graph):
                        writer.add_event(event)
            return writer

    @classmethod
    def clear(cls) -> None:
        """Close and forget every cached writer."""
        with cls._lock:
            writers, cls._writers = list(cls._writers.values()), {}
        for writer in writers:
            writer.close()


class SecondOrStepTimer:
    """Fires every N seconds or every N steps, and on its first call (TensorFlow's `SecondOrStepTimer`)."""

    def __init__(self, every_secs: float | None = None, every_steps: int | None = None) -> None:
        self.reset()
        self._every_secs = every_secs
        self._every_steps = every_steps
        if every_secs is None and every_steps is None:
            raise ValueError("Either every_secs or every_steps should be provided.")
        if every_secs is not None and every_steps is not None:
            raise ValueError("Can not provide both every_secs and every_steps.")

    def reset(self) -> None:
        self._last_step: int | None = None
        self._last_time: float | None = None

    def should_trigger_for_step(self, step: int) -> bool:
        if self._last_step is None:
            return True
        if self._last_step == step:
            return False
        if (
            self._every_secs is not None
            and self._last_time is not None
            and clock() >= self._last_time + self._every_secs
        ):
            return True
        return self._every_steps is not None and step >= self._last_step + self._every_steps

    def update_last_triggered_step(self, step: int) -> tuple[float | None, int | None]:
        """Record a trigger at `step`; return the seconds and steps since the previous one (None at first)."""
        now = clock()
        elapsed: tuple[float | None, int | None] = (None, None)
        if self._last_time is not None and self._last_step is not None:
            elapsed = (now - self._last_time, step - self._last_step)
        self._last_time = now
        self._last_step = step
        return elapsed

    def last_triggered_step(self) -> int | None:
        return self._last_step


def _summary_of(result: Any) -> Summary | bytes:
    """A summary op's result as `add_summary` takes it: a `Summary`, its bytes, or tag → scalar."""
    if isinstance(result, Summary | bytes):
        return result
    if isinstance(result, Mapping):
        return Summary(value=[Summary.Value(tag=str(tag), simple_value=float(v)) for tag, v in result.items()])
    raise TypeError(
        f"a summary op returned {type(result).__name__}; return a Summary, its serialized bytes, or a "
        "mapping of tag to scalar"
    )


def _tf_file_writer_run(summary_writer: Any) -> str | None:
    """The run a `tf.compat.v1.summary.FileWriter`'s logdir maps to (as `summaryd run` maps a framework's
    log_dir: below `SUMMARYD_RUN_ROOT`), or None for any other writer."""
    kind = type(summary_writer)
    if not kind.__module__.startswith("tensorflow.") or not callable(getattr(summary_writer, "get_logdir", None)):
        return None
    from summaryd.client._patch import DAEMON_LOGDIR_ENV, RUN_ROOT_ENV, run_path

    root, daemon_logdir = os.environ.get(RUN_ROOT_ENV, ""), os.environ.get(DAEMON_LOGDIR_ENV, "")
    return run_path(str(summary_writer.get_logdir()), root, daemon_logdir=daemon_logdir)


def _check_writer(summary_writer: Any) -> None:
    """Refuse, when the hook is made, a writer that would not go through the daemon (another library's)."""
    if summary_writer is not None and not isinstance(summary_writer, SummaryWriter):
        kind = f"{type(summary_writer).__module__}.{type(summary_writer).__name__}"
        raise TypeError(
            f"summary_writer is a {kind}; pass a summaryd.client.SummaryWriter, e.g. "
            "summary_writer=SummaryWriter('<run>'), a tf.compat.v1.summary.FileWriter, or only "
            "output_dir='<run>', and the hooks share one writer per run through the daemon"
        )


def _writer_or_run(summary_writer: Any, output_dir: str | None) -> tuple[SummaryWriter | None, str | None]:
    """The hook's writer and output_dir: a TensorFlow `FileWriter` becomes the hooks' shared writer of the run its
    logdir maps to (without the graph, as TensorFlow's hooks log none to a writer passed in); any other writer not
    ours is refused."""
    run = _tf_file_writer_run(summary_writer)
    if run is not None:
        return SummaryWriterCache.get(run), output_dir
    _check_writer(summary_writer)
    return summary_writer, output_dir


def _checked_output_dir(output_dir: str | None) -> str | None:
    """`output_dir` when the daemon would accept it as a run path; a ValueError saying what to change if not
    (raised when the hook is made, not when the first summary is dropped)."""
    if output_dir:
        run_dir_parts(str(output_dir), max_bytes=None, max_depth=None)
    return output_dir


def _writer_for(summary_writer: SummaryWriter | None, output_dir: str | None, graph: Any) -> SummaryWriter | None:
    if summary_writer is None and output_dir:
        return SummaryWriterCache.get(output_dir, graph)
    return summary_writer


class _PlainHookBase(SessionRunHook):
    """What the TensorFlow subclasses replace: the graph written with a new writer, where the global step comes
    from, and the type of `before_run`'s answer."""

    def _graph(self) -> Any:
        return None

    def _find_global_step(self) -> Any:
        return get_global_step()

    def _run_args(self, fetches: Any) -> Any:
        return SessionRunArgs(fetches)


class PlainSummarySaverHook(_PlainHookBase):
    """Saves summaries every `save_steps` steps or `save_secs` seconds, through the summaryd daemon.

    `summaryd.client.SummarySaverHook` is this class without TensorFlow, and a TensorFlow subclass of it with.

    Args:
        save_steps: save summaries every N steps. Exactly one of `save_secs` and `save_steps` should be set.
        save_secs: save summaries every N seconds.
        output_dir: run path under the daemon's logdir; used when no `summary_writer` is given.
        summary_writer: a `summaryd.client.SummaryWriter`, or a `tf.compat.v1.summary.FileWriter`: the hook then
            logs through the daemon to the run its logdir maps to (as `summaryd run` maps a framework's log_dir).
        scaffold: an object whose `summary_op` is used when `summary_op` is not given.
        summary_op: what to save: a callable returning a `Summary`, its bytes or a tag → scalar mapping, or a
            list of them (with TensorFlow: string tensors of serialized summaries).

    Raises:
        ValueError: unless exactly one of scaffold or summary_op is given, or exactly one of the intervals.
        TypeError: for a `summary_writer` that is neither a `summaryd.client.SummaryWriter` nor TF's `FileWriter`.
    """

    def __init__(
        self,
        save_steps: int | None = None,
        save_secs: float | None = None,
        output_dir: str | None = None,
        summary_writer: Any = None,
        scaffold: Any = None,
        summary_op: Any = None,
    ) -> None:
        if (scaffold is None) == (summary_op is None):
            raise ValueError("Exactly one of scaffold or summary_op must be provided.")
        self._summary_op = summary_op
        self._summary_writer: Any = summary_writer
        self._output_dir = _checked_output_dir(output_dir)
        self._scaffold = scaffold
        self._timer = SecondOrStepTimer(every_secs=save_secs, every_steps=save_steps)
        # After TensorFlow's own argument checks, which come first there.
        self._summary_writer, self._output_dir = _writer_or_run(summary_writer, self._output_dir)
        self._next_step: int | None = None
        self._request_summary = False
        self._global_step: Any = None

    def begin(self) -> None:
        self._summary_writer = _writer_for(self._summary_writer, self._output_dir, self._graph())
        self._next_step = None
        self._global_step = self._find_global_step()
        if self._global_step is None:
            raise RuntimeError("Global step should be created to use SummarySaverHook.")

    def _get_summary_op(self) -> list[Any] | None:
        summary_op = self._summary_op
        if summary_op is None and self._scaffold is not None:
            summary_op = self._scaffold.summary_op
        if summary_op is None:
            return None
        return summary_op if isinstance(summary_op, list) else [summary_op]

    def before_run(self, run_context: SessionRunContext) -> Any:
        self._request_summary = self._next_step is None or self._timer.should_trigger_for_step(self._next_step)
        requests: dict[str, Any] = {"global_step": self._global_step}
        if self._request_summary:
            summary_op = self._get_summary_op()
            if summary_op is not None:
                requests["summary"] = summary_op
        return self._run_args(requests)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        if not self._summary_writer:
            return
        global_step = int(run_values.results["global_step"]) + 1
        if self._next_step is None or self._request_summary:
            global_step = int(run_context.session.run(self._global_step))
        if self._next_step is None:
            self._summary_writer.add_session_log(SessionLog(status=SessionLog.START), global_step)
        if self._request_summary:
            self._timer.update_last_triggered_step(global_step)
            for summary in run_values.results.get("summary", ()):
                self._summary_writer.add_summary(_summary_of(summary), global_step)
        self._next_step = global_step + 1

    def end(self, session: Any = None) -> None:
        """Flush the writer and wait until the daemon confirms the summaries are on disk and synced."""
        if self._summary_writer:
            self._summary_writer.flush(durable=True)


class PlainStepCounterHook(_PlainHookBase):
    """Records `global_step/sec` every `every_n_steps` steps or `every_n_secs` seconds.

    `summaryd.client.StepCounterHook` is this class without TensorFlow, and a TensorFlow subclass of it with.

    Raises:
        ValueError: unless exactly one of `every_n_steps` and `every_n_secs` is given.
        TypeError: for a `summary_writer` that is neither a `summaryd.client.SummaryWriter` nor TF's `FileWriter`.
    """

    def __init__(
        self,
        every_n_steps: int | None = 100,
        every_n_secs: float | None = None,
        output_dir: str | None = None,
        summary_writer: Any = None,
    ) -> None:
        if (every_n_steps is None) == (every_n_secs is None):
            raise ValueError("exactly one of every_n_steps and every_n_secs should be provided.")
        self._timer = SecondOrStepTimer(every_steps=every_n_steps, every_secs=every_n_secs)
        self._summary_writer: Any
        self._summary_writer, self._output_dir = _writer_or_run(summary_writer, _checked_output_dir(output_dir))
        self._last_global_step: int | None = None
        self._steps_per_run = 1
        self._global_step: Any = None
        self._summary_tag = "global_step/sec"
        self._stalls_logged = 0

    def _set_steps_per_run(self, steps_per_run: int) -> None:
        self._steps_per_run = steps_per_run

    def begin(self) -> None:
        self._summary_writer = _writer_for(self._summary_writer, self._output_dir, self._graph())
        self._global_step = self._find_global_step()
        if self._global_step is None:
            raise RuntimeError("Global step should be created to use StepCounterHook.")

    def before_run(self, run_context: SessionRunContext) -> Any:
        return self._run_args(self._global_step)

    def _log_and_record(self, elapsed_steps: int, elapsed_time: float, global_step: int) -> None:
        steps_per_sec = elapsed_steps / elapsed_time if elapsed_time > 0 else float("inf")
        if self._summary_writer is not None:
            summary = Summary(value=[Summary.Value(tag=self._summary_tag, simple_value=steps_per_sec)])
            self._summary_writer.add_summary(summary, global_step)
        log.info("%s: %g", self._summary_tag, steps_per_sec)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        stale_global_step = int(run_values.results)
        if self._timer.should_trigger_for_step(stale_global_step + self._steps_per_run):
            global_step = int(run_context.session.run(self._global_step))
            if self._timer.should_trigger_for_step(global_step):
                elapsed_time, elapsed_steps = self._timer.update_last_triggered_step(global_step)
                if elapsed_time is not None and elapsed_steps is not None:
                    self._log_and_record(elapsed_steps, elapsed_time, global_step)
        # Some optimizers do not advance the global step on every run, so this is only a hint (first 5 times).
        if stale_global_step == self._last_global_step and self._stalls_logged < 5:
            self._stalls_logged += 1
            log.warning(
                "It seems that global step has not been increased. Current value (could be stable): %s",
                stale_global_step,
            )
        self._last_global_step = stale_global_step

    def end(self, session: Any = None) -> None:
        """Flush the writer and wait until the daemon confirms the rates are on disk and synced."""
        if self._summary_writer is not None:
            self._summary_writer.flush(durable=True)
