"""`SummaryCallback`: what `tf.keras.callbacks.TensorBoard` logs, written through the summaryd daemon.

```
from summaryd.client.keras import SummaryCallback      # instead of tf.keras.callbacks.TensorBoard

model.fit(x, y, validation_data=(vx, vy), epochs=3, callbacks=[SummaryCallback("mnist/lr-0.1")])
```

The tags, steps and run layout are those of Keras 3's `TensorBoard` callback: `<log_dir>/train` holds
`epoch_<metric>` and `epoch_learning_rate` at the epoch, `batch_<metric>` at the global batch (with
`update_freq`), the Keras model (`write_graph`) at step 0 and weight histograms (`histogram_freq`);
`<log_dir>/validation` holds `epoch_<metric>` of the `val_` metrics and `evaluation_<metric>_vs_iterations` at
the optimizer's iteration count. In a job of several workers each one writes to `<log_dir>/<worker>/train` and
`<log_dir>/<worker>/validation`. Scalars travel as `simple_value`s, which TensorBoard shows exactly like the
callback's tensor scalars. Training ends only once the daemon has synced everything.

Differences: the callback's `update_freq=N` also silences the epoch metrics of an epoch whose last batch number
is not a multiple of N (Keras 3.15's `record_if` stays active); this callback always logs them. Images,
profiling and embeddings need files of their own beside the event files and are refused.
"""

from __future__ import annotations

import os
import posixpath
import time
from collections.abc import Mapping
from typing import Any

import tensorflow as tf
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.util import tensor_util

from summaryd.client._environment import detect_worker
from summaryd.client._options import ClientOptions
from summaryd.client.writer import SummaryWriter
from summaryd.v1.runpath import run_dir_parts


def _scalar(value: Any) -> float:
    """A Python float from a float, numpy scalar, tensor or variable (without numpy's `__array__` path)."""
    return float(value.numpy() if hasattr(value, "numpy") else value)


def keras_model_summary(model: Any) -> Summary | None:
    """The `keras` summary `tf.keras.callbacks.TensorBoard(write_graph=True)` writes: the model's JSON, which
    TensorBoard's Graphs tab draws as a conceptual graph. None when the model does not serialize."""
    try:
        json_string = model.to_json()
    except Exception:  # as in Keras: a model that cannot serialize must not break training
        return None
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="graph_keras_model", content=b"1"))
    return Summary(
        value=[Summary.Value(tag="keras", metadata=metadata, tensor=tensor_util.make_tensor_proto(json_string))]
    )


class SummaryCallback(tf.keras.callbacks.Callback):  # type: ignore[misc]
    """A drop-in for `tf.keras.callbacks.TensorBoard` that ships its summaries to the summaryd daemon.

    Args:
        log_dir: run path under the daemon's logdir; `train` and `validation` sub-runs go below it.
        histogram_freq: every this many epochs, log a histogram of every weight (0: never).
        write_graph: log the Keras model (the Graphs tab's conceptual graph) at step 0 of `train`.
        write_images: not supported (Keras writes weight images); must be False.
        write_steps_per_second: also log `epoch_steps_per_second` (and `batch_steps_per_second`).
        update_freq: `"epoch"`; `"batch"` or N: also log `batch_<metric>` every N global batches.
        profile_batch, embeddings_freq, embeddings_metadata: not supported (they write files of their own);
            must be 0 / None.
        address: daemon `host:port`; default `SUMMARYD_ADDRESS`, else `localhost:6065`.
        worker: worker label; default from the launcher's environment (`TF_CONFIG`, `RANK`, ...); `""` writes
            to `<log_dir>/train` even in a larger job.

    Raises:
        ValueError: for an unsupported option or an `update_freq` that is not "epoch", "batch" or an int >= 1.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] = "logs",
        histogram_freq: int = 0,
        write_graph: bool = True,
        write_images: bool = False,
        write_steps_per_second: bool = False,
        update_freq: str | int = "epoch",
        profile_batch: int = 0,
        embeddings_freq: int = 0,
        embeddings_metadata: Any = None,
        *,
        address: str | None = None,
        worker: str | None = None,
    ) -> None:
        super().__init__()
        unsupported = {
            "write_images": write_images,
            "profile_batch": profile_batch,
            "embeddings_freq": embeddings_freq,
            "embeddings_metadata": embeddings_metadata,
        }
        for name, value in unsupported.items():
            if value:
                raise ValueError(
                    f"SummaryCallback does not support {name}={value!r}: it writes files beside the event files, "
                    "which the daemon does not; add a tf.keras.callbacks.TensorBoard for it"
                )
        if update_freq == "batch":
            update_freq = 1
        if update_freq != "epoch" and not (isinstance(update_freq, int) and update_freq >= 1):
            raise ValueError(f'update_freq must be "epoch", "batch" or an int >= 1, got {update_freq!r}')
        self.log_dir = os.fspath(log_dir).rstrip("/")
        self.histogram_freq = histogram_freq
        self.write_graph = write_graph
        self.write_steps_per_second = write_steps_per_second
        self.update_freq: str | int = update_freq
        detected = detect_worker()
        self.worker = detected.label if worker is None else worker
        self._world_size = detected.world_size
        base = posixpath.join(self.log_dir, self.worker) if self.worker else self.log_dir
        self._run_dirs = {"train": posixpath.join(base, "train"), "validation": posixpath.join(base, "validation")}
        # What the daemon would refuse fails here, as SummaryWriter's own checks do, not at the first epoch.
        for run in self._run_dirs.values():
            run_dir_parts(run, max_bytes=None, max_depth=None)
        self._options = ClientOptions.make(address=address)  # checks the address here, as SummaryWriter does
        self._writers: dict[str, SummaryWriter] = {}
        self._training = False
        self._global_train_batch = 0
        self._batch_start_time = 0.0
        self._epoch_start_time = 0.0
        self._epoch_start_iterations = 0

    @property
    def run_dirs(self) -> dict[str, str]:
        """The run paths (under the daemon's logdir) of the `train` and `validation` sub-runs."""
        return dict(self._run_dirs)

    def _writer(self, which: str) -> SummaryWriter:
        writer = self._writers.get(which)
        if writer is None:
            writer = self._writers[which] = SummaryWriter(
                self._run_dirs[which],
                worker="",  # the worker label is already part of the run path, above `train`/`validation`
                world_size=self._world_size,
                framework=f"summaryd-keras/{tf.keras.__version__}",
                options=self._options,
            )
        return writer

    def _log_scalars(self, which: str, scalars: Mapping[str, Any], prefix: str, step: int) -> None:
        writer = self._writer(which)
        for name, value in scalars.items():
            writer.add_scalar(f"{prefix}{name}", _scalar(value), step)

    def close(self) -> None:
        """Close the writers: returns once the daemon has synced everything logged (also at the end of `fit`)."""
        writers, self._writers = list(self._writers.values()), {}
        for writer in writers:
            writer.close()

    # ---- Keras callback API --------------------------------------------------------------------------------

    def set_model(self, model: Any) -> None:
        super().set_model(model)
        if self.write_graph:
            summary = keras_model_summary(model)
            if summary is not None:
                self._writer("train").add_summary(summary, 0)

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        self._training = True
        self._global_train_batch = 0

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        self._training = False
        self.close()

    def on_train_batch_begin(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        self._global_train_batch += 1
        if self.write_steps_per_second:
            self._batch_start_time = time.time()

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        if self.update_freq == "epoch" or self._global_train_batch % int(self.update_freq):
            return
        scalars = dict(logs) if isinstance(logs, Mapping) else {}
        if self.write_steps_per_second:
            scalars = {"steps_per_second": 1.0 / max(time.time() - self._batch_start_time, 1e-9), **scalars}
        self._log_scalars("train", scalars, "batch_", self._global_train_batch)

    def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        if self.write_steps_per_second:
            self._epoch_start_iterations = self._iterations()
            self._epoch_start_time = time.time()

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        logs = logs or {}
        train = {k: v for k, v in logs.items() if not k.startswith("val_")}
        validation = {k[len("val_") :]: v for k, v in logs.items() if k.startswith("val_")}
        if logs:  # Keras logs nothing, not even the learning rate, for an epoch without logs
            train.update(self._learning_rates())
            if self.write_steps_per_second:
                elapsed = max(time.time() - self._epoch_start_time, 1e-9)
                train["steps_per_second"] = (self._iterations() - self._epoch_start_iterations) / elapsed
        if train:
            self._log_scalars("train", train, "epoch_", epoch)
        if validation:
            self._log_scalars("validation", validation, "epoch_", epoch)
        if self.histogram_freq and epoch % self.histogram_freq == 0:
            self._log_weights(epoch)

    def on_test_end(self, logs: Mapping[str, Any] | None = None) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and hasattr(optimizer, "iterations") and logs:
            step = self._iterations()
            writer = self._writer("validation")
            for name, value in logs.items():
                writer.add_scalar(f"evaluation_{name}_vs_iterations", _scalar(value), step)
            if not self._training:  # `model.evaluate()` on its own: make its results visible now
                writer.flush(timeout=self._options.rpc_timeout)

    # ---- what the TensorBoard callback reads from the model ------------------------------------------------

    def _iterations(self) -> int:
        return int(_scalar(self.model.optimizer.iterations))

    def _learning_rates(self) -> dict[str, float]:
        """`learning_rate` (or `learning_rate_<name>` per optimizer of a multi-optimizer), as Keras logs it."""
        optimizer: Any = getattr(self.model, "optimizer", None)
        optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's own
        if hasattr(optimizer, "optimizers"):
            return {f"learning_rate_{opt.name}": _scalar(opt.learning_rate) for opt in optimizer.optimizers}
        if isinstance(optimizer, tf.keras.optimizers.Optimizer):
            return {"learning_rate": _scalar(optimizer.learning_rate)}
        return {}

    def _log_weights(self, epoch: int) -> None:
        writer = self._writer("train")
        for layer in self.model.layers:
            for weight in layer.weights:
                name = (getattr(weight, "path", None) or weight.name).replace(":", "_")
                writer.add_histogram(f"{name}/histogram", weight.numpy(), epoch)
