"""tensorboardX's `SummaryWriter` API on a summaryd writer: its methods, arguments, defaults and payloads.

`TensorboardXMethods` is mixed into the writer `patch()` puts in place of `tensorboardX.SummaryWriter`. Only a
process that imported tensorboardX builds one, so every summary is built by tensorboardX's own functions
(`tensorboardX.summary`, its graph loaders and embedding writers) and converted to TensorBoard's protos on the
sender thread: the bytes are tensorboardX's, where they differ from torch's (sub-run layout of `add_scalars`,
the `profiler` tag of a graph's run metadata, the projector's sprite and config text, the hparams messages).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import json
import logging
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
from tensorboard.compat.proto.event_pb2 import Event, TaggedRunMetadata
from tensorboard.compat.proto.summary_pb2 import Summary

from summaryd.client._api import _files, _summaries, _torch
from summaryd.client._sender import DeliveryReport, Sender
from summaryd.client.writer import SummaryWriter

log = logging.getLogger("summaryd.client")


@functools.cache
def _summary_module() -> Any:
    import tensorboardX.summary  # type: ignore[import-untyped]

    return tensorboardX.summary


_CLEAN_TAGS: dict[str, str] = {}  # tag → tensorboardX's cleaned tag, the hot path's cache
_CLEAN_TAGS_KEPT = 4096


def _clean_tag(tag: str) -> str:
    """tensorboardX's tag cleaning (characters outside `[-/\\w.]` become `_`), computed once per tag."""
    cleaned: str | None = _CLEAN_TAGS.get(tag)
    if cleaned is None:
        cleaned = _summary_module()._clean_tag(tag)
        if len(_CLEAN_TAGS) < _CLEAN_TAGS_KEPT:
            _CLEAN_TAGS[tag] = cleaned
    return cleaned


def _converted(message: Any) -> Summary:
    """A tensorboardX `Summary` (its own compiled protos) as TensorBoard's, by its bytes."""
    return Summary.FromString(message.SerializeToString())


def _build(function: str, *args: Any, **kwargs: Any) -> Summary:
    """Runs on the sender thread: tensorboardX's summary function `function`, its result converted."""
    return _converted(getattr(_summary_module(), function)(*args, **kwargs))


def _check_dataformats(array: Any, dataformats: str) -> None:
    """tensorboardX's `convert_to_HWC` checks, made at the call (the image is encoded later, elsewhere)."""
    letters = dataformats.upper()
    assert len(set(letters)) == len(letters), f"You can not use the same dimension shordhand twice. {letters}"
    assert array.ndim == len(letters), (
        f"size of input tensor and input format are different. tensor shape: {array.shape}, input_format: {letters}"
    )


@functools.cache
def _has_soundfile() -> bool:
    return importlib.util.find_spec("soundfile") is not None


class _Discarding:
    """A muted writer's queue as the inlined append sees it: it keeps nothing, and never calls in."""

    def __init__(self) -> None:
        self.inbox: deque[Any] = deque(maxlen=0)  # an append is dropped at once
        self.alert = 1  # never reached: the queue stays empty


class MutedSender:
    """The sender of a writer made with `write_to_disk=False`: takes every event and ships nothing, as
    tensorboardX's `DummyFileWriter` writes nothing (no connection, no thread, no directory)."""

    def __init__(self, run: str) -> None:
        self.run = run
        # What `SummaryWriter.add_scalar`'s inlined append reads: a queue that drops what is appended to it.
        self.queue = _Discarding()

    def submit(self, source: Any, nbytes: int = 64) -> bool:
        return True

    def enqueue(self, item: Any) -> bool:
        return True

    @property
    def address(self) -> str:
        return ""

    def send_now(self) -> DeliveryReport:
        return DeliveryReport(delivered=0, undelivered=0, synced=True)

    def flush(self, timeout: float | None = None, *, durable: bool = False) -> DeliveryReport:
        return DeliveryReport(delivered=0, undelivered=0, synced=True)

    def begin_close(self, deadline: float) -> None:
        return None

    def close(self, timeout: float | None = None) -> DeliveryReport:
        return DeliveryReport(delivered=0, undelivered=0, synced=True)

    def hand_over_after_close(self, successor: Callable[[], Sender]) -> None:
        return None


class TensorboardXProtos(SummaryWriter):
    """What tensorboardX's `FileWriter` does with events, for both its writers: `add_summary` and `add_event`
    take tensorboardX's own `Summary` and `Event` protos too (code built on `tensorboardX.summary` hands them
    over), and `use_metadata` gives the events it encloses a step and a wall time where the call gave none."""

    _default_metadata: Mapping[str, Any] = MappingProxyType({})

    def _stamp(self, global_step: int | None, walltime: float | None) -> tuple[int | None, float | None]:
        """The step and wall time of an event of the main run: `use_metadata`'s where the call gave none."""
        if not self._default_metadata:
            return global_step, walltime
        if global_step is None:
            global_step = self._default_metadata.get("global_step")
        if walltime is None:
            walltime = self._default_metadata.get("walltime")
        return global_step, walltime

    def add_summary(self, summary: Any, global_step: int | None = None, walltime: float | None = None) -> None:
        if not isinstance(summary, bytes | Summary):
            summary = summary.SerializeToString()  # the same message from another compiled module: its bytes
        super().add_summary(summary, *self._stamp(global_step, walltime))

    def add_event(self, event: Any, step: int | None = None, walltime: float | None = None) -> None:
        if not isinstance(event, Event):
            event = Event.FromString(event.SerializeToString())
        super().add_event(event, *self._stamp(step, walltime))

    @contextlib.contextmanager
    def use_metadata(self, *, global_step: int | None = None, walltime: float | None = None) -> Iterator[Any]:
        """Give the `add_*` calls it encloses this step and wall time where they give none (tensorboardX's)."""
        assert not self._default_metadata, "Default metadata is already set."
        assert global_step is not None or walltime is not None, (
            "At least one of `global_step` or `walltime` must be provided."
        )
        self._default_metadata = {"global_step": global_step, "walltime": walltime}
        try:
            yield self
        finally:
            self._default_metadata = {}


class TensorboardXFileWriterMethods(TensorboardXProtos):
    """tensorboardX's `FileWriter`'s graph methods, which take the protos its loaders made."""

    def add_graph(self, graph_profile: Any, walltime: float | None = None) -> None:  # type: ignore[override]
        """Log a `(GraphDef, RunStepStats)` pair, as torch's tracer gives it (run metadata tagged `profiler`)."""
        graph, step_stats = graph_profile
        self.add_event(Event(graph_def=graph.SerializeToString()), None, walltime)
        metadata = TaggedRunMetadata(tag="profiler", run_metadata=step_stats.SerializeToString())
        self.add_event(Event(tagged_run_metadata=metadata), None, walltime)

    def add_onnx_graph(self, graph: Any, walltime: float | None = None) -> None:
        """Log a `GraphDef` (tensorboardX's `load_onnx_graph` makes one)."""
        self.add_event(Event(graph_def=graph.SerializeToString()), None, walltime)

    def add_openvino_graph(self, graph: Any, walltime: float | None = None) -> None:
        """Log a `GraphDef` (tensorboardX's `load_openvino_graph` makes one)."""
        self.add_event(Event(graph_def=graph.SerializeToString()), None, walltime)


class TensorboardXMethods(TensorboardXProtos):
    """Every public method of tensorboardX 2.6's `SummaryWriter`, with its signature and defaults.

    tensorboardX's differences from torch's: `add_scalars` logs to `<logdir>/<main_tag>/<tag>` and keeps the
    values for `export_scalars_to_json`; `add_hparams(name=...)` takes no discrete domains; `add_scalar` takes
    a display name and a description; `add_video` a `dataformats`; `add_images` a list of CHW or HWC images;
    `use_metadata` sets the step and wall time of the calls it encloses; `add_openvino_graph`.
    """

    write_to_disk = True

    def _tbx_init(self, local_dir: str) -> None:
        """What tensorboardX's constructor sets besides the file writer."""
        self.logdir = local_dir
        self.scalar_dict: dict[str, list[list[float]]] = {}
        self._projector_text = ""

    def _new_sender(self, run: str) -> Sender:
        if not self.write_to_disk:
            return MutedSender(run)  # type: ignore[return-value]
        return super()._new_sender(run)

    def close(self, timeout: float | None = None) -> DeliveryReport:
        if not self.write_to_disk:  # nothing was ever sent, nothing is open
            self._closed = True
            return DeliveryReport(delivered=0, undelivered=0, synced=True)
        return super().close(timeout)

    def _add(
        self, function: str, args: tuple[Any, ...], global_step: int | None, walltime: float | None, nbytes: int = 96
    ) -> None:
        """Queue tensorboardX's `function(*args)`, built on the sender thread, to the main run."""
        step, wall_time = self._stamp(global_step, walltime)
        self._log(functools.partial(_build, function, *args), step, wall_time, nbytes)

    def _add_event(self, event: Event) -> None:
        self.add_event(event)

    # ---- scalars ------------------------------------------------------------------------------------------

    def add_scalar(  # type: ignore[override]
        self,
        tag: str,
        scalar_value: Any,
        global_step: int | None = None,
        walltime: float | None = None,
        display_name: str | None = "",
        summary_description: str | None = "",
    ) -> None:
        """Log one scalar; a display name or a description goes in its metadata, as tensorboardX does."""
        tag = _CLEAN_TAGS.get(tag) or _clean_tag(tag)
        if display_name == "" and summary_description == "" and not self._default_metadata:
            SummaryWriter.add_scalar(self, tag, scalar_value, global_step, walltime)  # the hot path, as torch's
            return
        value = _torch.to_float(scalar_value)
        step, wall_time = self._stamp(global_step, walltime)
        if display_name == "" and summary_description == "":
            SummaryWriter.add_scalar(self, tag, value, step, wall_time)
            return
        self._add("scalar", (tag, value, display_name, summary_description), step, wall_time)

    def add_scalars(
        self,
        main_tag: str,
        tag_scalar_dict: Mapping[str, Any],
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Log several scalars in one chart: each key to the sub-run `<logdir>/<main_tag>/<key>`, kept for
        `export_scalars_to_json` too."""
        walltime = time.time() if walltime is None else walltime
        clean = _clean_tag(main_tag)
        for key, scalar_value in tag_scalar_dict.items():
            value = _torch.to_float(scalar_value)
            sender = self._sub_sender(f"{main_tag.strip('/')}/{key}")
            self._log_scalar(clean, value, global_step, walltime, sender)
            local = os.path.join(str(self.logdir), main_tag, key)
            self.scalar_dict.setdefault(local, []).append([walltime, global_step, value])  # type: ignore[list-item]

    def export_scalars_to_json(self, path: str | os.PathLike[str]) -> None:
        """Write the scalars `add_scalars` logged so far to `path` as `{writer_id: [[time, step, value]]}`, and
        forget them (tensorboardX's)."""
        with open(path, "w") as f:
            json.dump(self.scalar_dict, f)
        self.scalar_dict = {}

    # ---- histograms, images, video, audio, text --------------------------------------------------------------

    def add_histogram(
        self,
        tag: str,
        values: Any,
        global_step: int | None = None,
        bins: Any = "tensorflow",
        walltime: float | None = None,
        max_bins: int | None = None,
    ) -> None:
        array = _torch.to_numpy(values)
        if isinstance(bins, str) and bins == "tensorflow":
            bins = self.default_bins
        self._add("histogram", (tag, array, bins, max_bins), global_step, walltime, 96 + array.nbytes)

    def add_histogram_raw(
        self,
        tag: str,
        min: Any,  # tensorboardX's argument names
        max: Any,
        num: Any,
        sum: Any,
        sum_squares: Any,
        bucket_limits: Any,
        bucket_counts: Any,
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        if len(bucket_limits) != len(bucket_counts):
            raise ValueError("len(bucket_limits) != len(bucket_counts), see the document.")
        summary = _converted(
            _summary_module().histogram_raw(tag, min, max, num, sum, sum_squares, bucket_limits, bucket_counts)
        )
        self._log_now(summary, *self._stamp(global_step, walltime))

    def add_image(
        self,
        tag: str,
        img_tensor: Any,
        global_step: int | None = None,
        walltime: float | None = None,
        dataformats: str | None = "CHW",
    ) -> None:
        array = _torch.to_numpy(img_tensor)
        _check_dataformats(array, dataformats or "CHW")
        self._add("image", (tag, array, 1, dataformats), global_step, walltime, 96 + array.nbytes)

    def add_images(
        self,
        tag: str,
        img_tensor: Any,
        global_step: int | None = None,
        walltime: float | None = None,
        dataformats: str | None = "NCHW",
    ) -> None:
        """Log a batch of images as one grid: an N-dimensional array, or a list of CHW or HWC images."""
        dataformats = dataformats or "NCHW"
        if isinstance(img_tensor, list):
            if dataformats.upper() not in ("CHW", "HWC"):
                log.warning("add_images(%r): a list of images needs dataformats CHW or HWC; nothing is written", tag)
                return
            array = np.stack([_torch.to_numpy(image) for image in img_tensor], 0)
            dataformats = "N" + dataformats
        else:
            array = _torch.to_numpy(img_tensor)
        _check_dataformats(array, dataformats)
        self._add("image", (tag, array, 1, dataformats), global_step, walltime, 96 + array.nbytes)

    def add_image_with_boxes(  # type: ignore[override]
        self,
        tag: str,
        img_tensor: Any,
        box_tensor: Any,
        global_step: int | None = None,
        walltime: float | None = None,
        dataformats: str | None = "CHW",
        labels: Sequence[str] | str | None = None,
        **kwargs: Any,
    ) -> None:
        array, boxes = _torch.to_numpy(img_tensor), _torch.to_numpy(box_tensor)
        if labels is not None:
            labels = [labels] if isinstance(labels, str) else list(labels)
            if len(labels) != boxes.shape[0]:
                log.warning("add_image_with_boxes(%r): as many labels as boxes needed; the labels are left out", tag)
                labels = None
        _check_dataformats(array, dataformats or "CHW")
        step, wall_time = self._stamp(global_step, walltime)
        build = functools.partial(
            _build, "image_boxes", tag, array, boxes, dataformats=dataformats, labels=labels, **kwargs
        )
        self._log(build, step, wall_time, 96 + array.nbytes)

    def add_figure(
        self,
        tag: str,
        figure: Any,
        global_step: int | None = None,
        close: bool | None = True,
        walltime: float | None = None,
    ) -> None:
        """Log a matplotlib figure (or a list of them), rendered on the caller's thread by tensorboardX."""
        from tensorboardX.utils import figure_to_image  # type: ignore[import-untyped]

        pixels = figure_to_image(figure, close)
        self.add_image(tag, pixels, global_step, walltime, dataformats="NCHW" if isinstance(figure, list) else "CHW")

    def add_video(
        self,
        tag: str,
        vid_tensor: Any,
        global_step: int | None = None,
        fps: float | None = 4,
        walltime: float | None = None,
        dataformats: str | None = "NTCHW",
    ) -> None:
        array = _torch.to_numpy(vid_tensor)
        self._add("video", (tag, array, fps, dataformats), global_step, walltime, 96 + array.nbytes)

    def add_audio(
        self,
        tag: str,
        snd_tensor: Any,
        global_step: int | None = None,
        sample_rate: int | None = 44100,
        walltime: float | None = None,
    ) -> None:
        """Log audio, encoded by tensorboardX (with soundfile); without soundfile, which tensorboardX needs, the
        16-bit mono WAV torch's writer logs."""
        array = _torch.to_numpy(snd_tensor)
        if not _has_soundfile():
            step, wall_time = self._stamp(global_step, walltime)
            build = functools.partial(_summaries.audio, tag, array, sample_rate=sample_rate or 44100)
            self._log(build, step, wall_time, 96 + array.nbytes)
            return
        self._add("audio", (tag, array, sample_rate), global_step, walltime, 96 + array.nbytes)

    def add_text(
        self, tag: str, text_string: str, global_step: int | None = None, walltime: float | None = None
    ) -> None:
        text_string = str(text_string)
        self._add("text", (tag, text_string), global_step, walltime, 96 + len(text_string))

    # ---- graphs ---------------------------------------------------------------------------------------------

    def add_graph(
        self, model: Any, input_to_model: Any = None, verbose: bool = False, use_strict_trace: bool = True
    ) -> None:
        """Log a `torch.nn.Module`'s graph, traced by torch on the caller's thread; its run metadata is tagged
        `profiler`, as tensorboardX tags it."""
        graph_def, step_stats = _torch.graph(model, input_to_model, verbose, use_strict_trace)
        self._add_event(Event(graph_def=graph_def.SerializeToString()))
        metadata = TaggedRunMetadata(tag="profiler", run_metadata=step_stats.SerializeToString())
        self._add_event(Event(tagged_run_metadata=metadata))

    def add_onnx_graph(self, onnx_model_file: str) -> None:
        """Log the graph of an ONNX model file, read by tensorboardX's converter (needs onnx)."""
        from tensorboardX.onnx_graph import load_onnx_graph  # type: ignore[import-untyped]

        self._add_event(Event(graph_def=load_onnx_graph(onnx_model_file).SerializeToString()))

    def add_openvino_graph(self, xmlname: str) -> None:
        """Log the graph of an OpenVINO model (its `.xml` file), read by tensorboardX's converter."""
        from tensorboardX.openvino_graph import load_openvino_graph  # type: ignore[import-untyped]

        self._add_event(Event(graph_def=load_openvino_graph(xmlname).SerializeToString()))

    # ---- embeddings, PR curves, custom scalars, meshes, hyperparameters ---------------------------------------

    def add_embedding(
        self,
        mat: Any,
        metadata: Sequence[Any] | None = None,
        label_img: Any = None,
        global_step: int | None = None,
        tag: str = "default",
        metadata_header: Sequence[str] | None = None,
    ) -> None:
        """Log data for the embedding projector: tensorboardX's files, uploaded beside the run's event files
        and encoded on a background thread."""
        array = _torch.to_numpy(mat)
        step = 0 if global_step is None else global_step
        subdir = f"{str(step).zfill(5)}/{_files.encode_tag(tag)}"
        rows = None if metadata is None else list(metadata)
        if rows is not None:
            assert array.shape[0] == len(rows), "#labels should equal with #data points"
            if metadata_header:
                assert len(metadata_header) == len(rows[0]), (
                    "len of header must be equal to the number of columns in metadata"
                )
        images = None if label_img is None else _torch.to_numpy(label_img)
        if images is not None:
            assert array.shape[0] == images.shape[0], "#images should equal with #data points"
            assert images.shape[2] == images.shape[3], "Image should be square, see tensorflow/tensorboard#670"
        assert array.ndim == 2, "mat should be 2D, where mat.size(0) is the number of data points"
        header = None if metadata_header is None else list(metadata_header)
        with tempfile.TemporaryDirectory(prefix="summaryd-projector-") as folder:
            from tensorboardX.embedding import append_pbtxt  # type: ignore[import-untyped]

            append_pbtxt(rows, images, folder, subdir, step, tag)  # a few lines of text
            with open(os.path.join(folder, "projector_config.pbtxt"), "rb") as entry:
                self._projector_text += entry.read().decode()
        # The whole config every time (tensorboardX appends to its file): a resent upload never loses an entry.
        config = self._projector_text.encode()
        if not self.write_to_disk:
            return

        def encode() -> list[tuple[str, bytes]]:
            return [*_embedding_files(subdir, array, rows, images, header), ("projector_config.pbtxt", config)]

        if self._uploader is None:
            self._uploader = _files.FileUploader(self._sender)
        self._uploader.submit(encode)

    def add_pr_curve(
        self,
        tag: str,
        labels: Any,
        predictions: Any,
        global_step: int | None = None,
        num_thresholds: int | None = 127,
        weights: Any = None,
        walltime: float | None = None,
    ) -> None:
        label_array, prediction_array = _torch.to_numpy(labels), _torch.to_numpy(predictions)
        if weights is not None and not isinstance(weights, int | float):
            weights = _torch.to_numpy(weights)
        nbytes = 96 + label_array.nbytes + prediction_array.nbytes
        self._add(
            "pr_curve", (tag, label_array, prediction_array, num_thresholds, weights), global_step, walltime, nbytes
        )

    def add_pr_curve_raw(
        self,
        tag: str,
        true_positive_counts: Any,
        false_positive_counts: Any,
        true_negative_counts: Any,
        false_negative_counts: Any,
        precision: Any,
        recall: Any,
        global_step: int | None = None,
        num_thresholds: int | None = 127,
        weights: Any = None,
        walltime: float | None = None,
    ) -> None:
        counts = (
            true_positive_counts,
            false_positive_counts,
            true_negative_counts,
            false_negative_counts,
            precision,
            recall,
        )
        columns = tuple(_torch.to_numpy(c) for c in counts)
        nbytes = 96 + sum(c.nbytes for c in columns)
        self._add("pr_curve_raw", (tag, *columns, num_thresholds, weights), global_step, walltime, nbytes)

    def add_custom_scalars_multilinechart(
        self, tags: Sequence[str], category: str = "default", title: str = "untitled"
    ) -> None:
        self.add_custom_scalars({category: {title: ["Multiline", tags]}})

    def add_custom_scalars_marginchart(
        self, tags: Sequence[str], category: str = "default", title: str = "untitled"
    ) -> None:
        assert len(tags) == 3
        self.add_custom_scalars({category: {title: ["Margin", tags]}})

    def add_custom_scalars(self, layout: Mapping[str, Mapping[str, Sequence[Any]]]) -> None:
        self._log_now(_converted(_summary_module().custom_scalars(layout)), *self._stamp(None, None))

    def add_mesh(
        self,
        tag: str,
        vertices: Any,
        colors: Any = None,
        faces: Any = None,
        config_dict: dict[str, Any] | None = None,
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        vertex_array = _torch.to_numpy(vertices)
        color_array = None if colors is None else _torch.to_numpy(colors)
        face_array = None if faces is None else _torch.to_numpy(faces)
        args = (tag, vertex_array, color_array, face_array, copy.deepcopy(config_dict))
        self._add("mesh", args, global_step, walltime, 96 + 3 * vertex_array.nbytes)

    def add_hparams(  # type: ignore[override]
        self,
        hparam_dict: dict[str, Any],
        metric_dict: dict[str, Any],
        name: str | None = None,
        global_step: int | None = None,
    ) -> None:
        """Log hyperparameters and their metrics to the sub-run `<logdir>/<name>` (default: the current time)."""
        if type(hparam_dict) is not dict or type(metric_dict) is not dict:
            raise TypeError("hparam_dict and metric_dict should be dictionary.")
        summaries = _summary_module().hparams(hparam_dict, metric_dict)
        sender = self._sub_sender(name or str(time.time()))
        for summary in summaries:
            self._log_now(_converted(summary), None, None, sender=sender)
        for tag, value in metric_dict.items():
            self._log_scalar(_clean_tag(tag), _torch.to_float(value), global_step, None, sender)


def _embedding_files(
    subdir: str, mat: Any, metadata: list[Any] | None, label_img: Any, header: list[str] | None
) -> list[tuple[str, bytes]]:
    """The files of one `add_embedding` call, under `subdir`, as tensorboardX's own functions write them."""
    from tensorboardX.embedding import make_mat, make_sprite, make_tsv

    names = []
    with tempfile.TemporaryDirectory(prefix="summaryd-embedding-") as folder:
        if metadata is not None:
            make_tsv(metadata, folder, metadata_header=header)
            names.append("metadata.tsv")
        if label_img is not None:
            make_sprite(label_img, folder)
            names.append("sprite.png")
        make_mat(mat, folder)
        names.append("tensors.tsv")
        files = []
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                files.append((f"{subdir}/{name}", f.read()))
    return files
