"""The hooks as `tf.compat.v1.train.SessionRunHook` subclasses, for `MonitoredTrainingSession`.

Imported only when `summaryd.client.SummarySaverHook` or `StepCounterHook` is first touched and TensorFlow is
installed (see `summaryd.client.hooks.__getattr__`). `MonitoredSession` itself only calls the hook methods, but
code around it (and users) may check `isinstance(hook, tf.compat.v1.train.SessionRunHook)`, so these are real
subclasses.

Inside a TensorFlow graph (what `MonitoredSession` needs) they do what TensorFlow's hooks do: the global step is
`training_util._get_or_create_global_step_read()` of the default graph, `before_run` answers with TensorFlow's
`SessionRunArgs`, and a writer created for an `output_dir` first logs the default graph as `FileWriter` does.
Executing eagerly (no graph to run in) they keep the plain hooks' behaviour for `MonitoredLoop`.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorboard.compat.proto.event_pb2 import Event

# The functions TensorFlow's own hooks and `FileWriter` call; they have no public equivalent.
from tensorflow.python.framework import meta_graph
from tensorflow.python.training import training_util

from summaryd.client._api._hooks import PlainStepCounterHook, PlainSummarySaverHook


def graph_events(graph: Any) -> list[Event]:
    """The events `tf.compat.v1.summary.FileWriter(logdir, graph)` writes first: `graph_def`, `meta_graph_def`."""
    graph_def = graph.as_graph_def(add_shapes=True)
    meta_graph_def = meta_graph.create_meta_graph_def(graph_def=graph_def)
    return [
        Event(graph_def=graph_def.SerializeToString()),
        Event(meta_graph_def=meta_graph_def.SerializeToString()),
    ]


def _in_graph() -> bool:
    return not tf.executing_eagerly()


class SummarySaverHook(PlainSummarySaverHook, tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """`tf.compat.v1.train.SummarySaverHook`, writing through the summaryd daemon.

    Same arguments and errors as TensorFlow's; `summary_writer` is a `summaryd.client.SummaryWriter`, and
    `output_dir` the run path under the daemon's logdir (hooks naming the same one share one writer, which
    first logs the graph). `end()` returns once the daemon has synced what the hook logged.
    """

    def _graph(self) -> Any:
        return tf.compat.v1.get_default_graph() if _in_graph() else None

    def _find_global_step(self) -> Any:
        if _in_graph():
            return training_util._get_or_create_global_step_read()
        return super()._find_global_step()

    def _run_args(self, fetches: Any) -> Any:
        return tf.compat.v1.train.SessionRunArgs(fetches)


class StepCounterHook(PlainStepCounterHook, tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """`tf.compat.v1.train.StepCounterHook`, writing `<global step name>/sec` through the summaryd daemon."""

    def _graph(self) -> Any:
        return tf.compat.v1.get_default_graph() if _in_graph() else None

    def _find_global_step(self) -> Any:
        if _in_graph():
            read = training_util._get_or_create_global_step_read()
            if read is not None:
                self._summary_tag = tf.compat.v1.train.get_global_step().op.name + "/sec"
            return read
        return super()._find_global_step()

    def _run_args(self, fetches: Any) -> Any:
        return tf.compat.v1.train.SessionRunArgs(fetches)
