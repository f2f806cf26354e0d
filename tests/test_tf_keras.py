"""`summaryd.client.keras.SummaryCallback` in Keras' `model.fit`, with real `tensorflow-cpu`.

Parity: one `fit` runs with both `tf.keras.callbacks.TensorBoard` writing locally and our callback writing
through a real daemon, so both see the very same logs; TensorBoard's plugin-level reader (which turns our
`simple_value` scalars into the tensor scalars TF2 writes, as the TensorBoard server does) must find the same
runs, tags, steps and values. A real `tensorboard` process then serves the daemon's runs.

The model trains 3 epochs of 4 batches (64 examples, batch size 16) with 2 validation batches per epoch, so
`evaluation_*_vs_iterations` land at the optimizer's iterations 4, 8, 12.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from _support import Daemon, event_files

pytestmark = pytest.mark.slow

EPOCHS = 3
BATCHES = 4  # per epoch
LAUNCHER_VARIABLES = ("TF_CONFIG", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
# Keras 3.15's own TensorBoard callback reads the learning rate with `np.array(variable)`, which numpy 2 flags;
# only the tests that run that callback next to ours let this one warning through.
KERAS_TENSORBOARD_NUMPY_WARNING = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)


@pytest.fixture(scope="module")
def tf() -> Any:
    import tensorflow

    return tensorflow


@pytest.fixture
def address(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SUMMARYD_ADDRESS", daemon.address)
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return daemon.address


def fit(tf: Any, callbacks: list[Any]) -> Any:
    """A small deterministic classifier, fitted for 3 epochs with validation data; returns its History."""
    tf.keras.utils.set_random_seed(0)
    rng = np.random.RandomState(0)
    x = rng.rand(64, 4).astype("float32")
    y = (x.sum(axis=1) > 2).astype("int32")
    keras = tf.keras
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model.fit(
        x, y, batch_size=16, epochs=EPOCHS, validation_data=(x[:32], y[:32]), verbose=0, callbacks=callbacks
    )


def read_run(run_dir: Path) -> dict[str, dict[str, list[tuple[int, Any]]]]:
    """plugin -> tag -> [(step, value)] of one run, through TensorBoard's plugin-level accumulator."""
    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    found: dict[str, dict[str, list[tuple[int, Any]]]] = {}
    for plugin in ("scalars", "histograms", "graph_keras_model"):
        for tag in acc.PluginTagToContent(plugin) if plugin in acc.ActivePlugins() else ():
            found.setdefault(plugin, {})[tag] = [
                (e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)
            ]
    return found


def scalars(run: dict[str, dict[str, list[tuple[int, Any]]]]) -> dict[str, list[tuple[int, float]]]:
    return {tag: [(step, float(value)) for step, value in points] for tag, points in run["scalars"].items()}


def steps(run: dict[str, dict[str, list[tuple[int, Any]]]], plugin: str) -> dict[str, list[int]]:
    return {tag: [step for step, _ in points] for tag, points in run.get(plugin, {}).items()}


TRAIN_EPOCH_TAGS = {"epoch_loss", "epoch_accuracy", "epoch_learning_rate"}
VALIDATION_TAGS = {
    "epoch_loss",
    "epoch_accuracy",
    "evaluation_loss_vs_iterations",
    "evaluation_accuracy_vs_iterations",
}


@KERAS_TENSORBOARD_NUMPY_WARNING
@pytest.mark.parametrize(
    "options",
    [
        {"update_freq": "epoch"},
        {"update_freq": "batch", "histogram_freq": 1, "write_steps_per_second": True},
    ],
    ids=["epoch", "batch+histograms+steps_per_second"],
)
def test_same_runs_tags_steps_and_values_as_the_tensorboard_callback(
    tf: Any, address: str, daemon: Daemon, tmp_path: Path, options: dict[str, Any]
) -> None:
    from summaryd.client.keras import SummaryCallback

    local = tmp_path / "keras-local"
    ours = SummaryCallback("kfit", **options)
    history = fit(tf, [tf.keras.callbacks.TensorBoard(str(local), **options), ours])

    assert ours.run_dirs == {"train": "kfit/train", "validation": "kfit/validation"}
    assert sorted(p.name for p in (daemon.logdir / "kfit").iterdir()) == ["train", "validation"]
    for sub in ("train", "validation"):
        # `fit` has returned: our writers are closed, so every event is on disk, in one file per run.
        assert len(event_files(daemon.logdir / "kfit" / sub)) == 1
        theirs_run, ours_run = read_run(local / sub), read_run(daemon.logdir / "kfit" / sub)
        assert set(ours_run) == set(theirs_run)
        theirs_scalars, ours_scalars = scalars(theirs_run), scalars(ours_run)
        assert set(ours_scalars) == set(theirs_scalars)
        for tag in ours_scalars:
            if tag.endswith("steps_per_second"):  # a timing: compare where it is logged, not what
                assert [s for s, _ in ours_scalars[tag]] == [s for s, _ in theirs_scalars[tag]], (sub, tag)
            else:
                assert ours_scalars[tag] == theirs_scalars[tag], (sub, tag)
        assert steps(ours_run, "histograms") == steps(theirs_run, "histograms")
        assert ours_run.get("graph_keras_model") == theirs_run.get("graph_keras_model")

    train = scalars(read_run(daemon.logdir / "kfit" / "train"))
    validation = scalars(read_run(daemon.logdir / "kfit" / "validation"))
    assert set(train) >= TRAIN_EPOCH_TAGS
    assert set(validation) == VALIDATION_TAGS
    assert [s for s, _ in train["epoch_loss"]] == list(range(EPOCHS))
    assert [v for _, v in train["epoch_loss"]] == pytest.approx(history.history["loss"])
    assert [v for _, v in validation["epoch_loss"]] == pytest.approx(history.history["val_loss"])
    assert [v for _, v in train["epoch_learning_rate"]] == pytest.approx([0.1] * EPOCHS)
    assert [s for s, _ in validation["evaluation_loss_vs_iterations"]] == [4, 8, 12]
    if options["update_freq"] == "batch":
        assert [s for s, _ in train["batch_loss"]] == list(range(1, EPOCHS * BATCHES + 1))
        assert "epoch_steps_per_second" in train and "batch_steps_per_second" in train
        assert len(steps(read_run(daemon.logdir / "kfit" / "train"), "histograms")) == 4  # 2 layers x 2 weights
    else:
        assert not any(tag.startswith("batch_") for tag in train)


def test_update_freq_n_logs_every_nth_batch_and_every_epoch(tf: Any, address: str, daemon: Daemon) -> None:
    """`update_freq=3`: batch metrics at global batches 3, 6, 9, 12; epoch metrics at every epoch regardless.
    (This run has only our callback, under `filterwarnings = error`: it reads the model without warnings.)"""
    from summaryd.client.keras import SummaryCallback

    fit(tf, [SummaryCallback("every3", update_freq=3, write_graph=False)])

    train = scalars(read_run(daemon.logdir / "every3" / "train"))
    assert [s for s, _ in train["batch_loss"]] == [3, 6, 9, 12]
    assert [s for s, _ in train["batch_accuracy"]] == [3, 6, 9, 12]
    for tag in TRAIN_EPOCH_TAGS:
        assert [s for s, _ in train[tag]] == [0, 1, 2], tag
    assert "graph_keras_model" not in read_run(daemon.logdir / "every3" / "train")
    validation = scalars(read_run(daemon.logdir / "every3" / "validation"))
    assert [s for s, _ in validation["evaluation_accuracy_vs_iterations"]] == [4, 8, 12]


def test_each_worker_writes_its_own_train_and_validation_runs(
    tf: Any, address: str, daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a two-worker `TF_CONFIG`, worker 1's callback writes `<run>/worker-1/train` and `.../validation`."""
    from summaryd.client.keras import SummaryCallback

    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}))
    callback = SummaryCallback("multi")
    fit(tf, [callback])

    assert callback.run_dirs == {"train": "multi/worker-1/train", "validation": "multi/worker-1/validation"}
    assert sorted(p.name for p in (daemon.logdir / "multi").iterdir()) == ["worker-1"]
    for sub in ("train", "validation"):
        run = scalars(read_run(daemon.logdir / "multi" / "worker-1" / sub))
        assert [s for s, _ in run["epoch_loss"]] == [0, 1, 2]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"write_images": True}, "SummaryCallback does not support write_images=True"),
        ({"profile_batch": 2}, "SummaryCallback does not support profile_batch=2"),
        ({"embeddings_freq": 1}, "SummaryCallback does not support embeddings_freq=1"),
        ({"update_freq": 0}, 'update_freq must be "epoch", "batch" or an int >= 1, got 0'),
        ({"update_freq": "step"}, 'update_freq must be "epoch", "batch" or an int >= 1, got \'step\''),
    ],
)
def test_unsupported_options_are_refused_with_a_reason(tf: Any, options: dict[str, Any], message: str) -> None:
    from summaryd.client.keras import SummaryCallback

    with pytest.raises(ValueError) as raised:
        SummaryCallback("refused", **options)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    ("log_dir", "address", "message"),
    [
        ("../up", None, "run path '../up/train' has an empty, '.' or '..' component"),
        ("/abs", None, "run path '/abs/train' is absolute"),
        ("ok", "http://localhost:6065", "address 'http://localhost:6065' is a URL"),
    ],
)
def test_a_run_or_address_the_daemon_refuses_raises_at_once(
    tf: Any, log_dir: str, address: str | None, message: str
) -> None:
    """When the callback is made, not at the first epoch when its writers are."""
    from summaryd.client.keras import SummaryCallback

    with pytest.raises(ValueError) as raised:
        SummaryCallback(log_dir, address=address, worker="")
    assert str(raised.value).startswith(message)


# ---- a real TensorBoard serves the runs ------------------------------------------------------------------------

SERVING = re.compile(r"TensorBoard \S+ at http://127\.0\.0\.1:(\d+)/")


@pytest.fixture
def tensorboard(daemon: Daemon, tmp_path: Path) -> Iterator[Any]:
    """A `tensorboard --load_fast=false` process on the daemon's logdir; yields a GET function for its JSON
    routes. Stopped by its pid."""
    log_path = tmp_path / "tensorboard.log"
    daemon.logdir.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "tensorboard.main", "--logdir", str(daemon.logdir), "--host", "127.0.0.1"]
    args += ["--port", "0", "--reload_interval", "1", "--load_fast=false"]
    env = {**os.environ, "TMPDIR": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "2"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (match := SERVING.search(log_path.read_text(errors="replace"))):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.1)
        port = int(match.group(1))

        def get(path: str, **query: str) -> Any:
            url = f"http://127.0.0.1:{port}{path}" + ("?" + urllib.parse.urlencode(query) if query else "")
            try:
                with urllib.request.urlopen(url, timeout=10) as answer:
                    return json.loads(answer.read())
            except urllib.error.HTTPError as e:
                e.close()
                return None

        yield get
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_real_tensorboard_serves_the_train_and_validation_runs(tf: Any, address: str, tensorboard: Any) -> None:
    """`model.fit` for 3 epochs with our callback; the TensorBoard server lists both runs and serves each
    epoch metric at epochs 0, 1, 2 with the values `fit` reported."""
    from summaryd.client.keras import SummaryCallback

    history = fit(tf, [SummaryCallback("served")])

    def served(run: str, tag: str) -> list[tuple[int, float]]:
        points = tensorboard("/data/plugin/scalars/scalars", run=run, tag=tag) or []
        return [(int(step), float(value)) for _, step, value in points]

    expected = {
        ("served/train", "epoch_loss"): history.history["loss"],
        ("served/train", "epoch_accuracy"): history.history["accuracy"],
        ("served/validation", "epoch_loss"): history.history["val_loss"],
        ("served/validation", "epoch_accuracy"): history.history["val_accuracy"],
    }
    deadline = time.monotonic() + 30  # TensorBoard reloads the logdir every second
    while any(len(served(run, tag)) < EPOCHS for run, tag in expected):
        assert time.monotonic() < deadline, {key: served(*key) for key in expected}
        time.sleep(0.2)

    assert sorted(tensorboard("/data/runs")) == ["served/train", "served/validation"]
    tags = tensorboard("/data/plugin/scalars/tags")
    assert set(tags["served/train"]) == TRAIN_EPOCH_TAGS
    assert set(tags["served/validation"]) == VALIDATION_TAGS
    for (run, tag), values in expected.items():
        points = served(run, tag)
        assert [step for step, _ in points] == list(range(EPOCHS)), (run, tag)
        assert [value for _, value in points] == pytest.approx(values), (run, tag)
