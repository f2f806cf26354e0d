"""Summary builders for a process that has not imported torch: numpy in, `Summary` out.

Each function has the name and the signature of its counterpart in `torch.utils.tensorboard.summary`, so the
writer calls either set the same way. They use the `tensorboard` package's own builders where it has them without
TensorFlow (`scalar_pb`, `histogram_pb`, `text_pb`, `hparams_pb`, `hparams_config_pb`) and its plugins' metadata
and `make_tensor_proto` elsewhere. The README lists where these payloads differ from torch's. Images, audio and
raw histograms are built exactly as torch builds them.

The writer hands these functions copies of the caller's data and runs the expensive ones (PNG, GIF, WAV,
histogram bucketing) on the sender thread.
"""

from __future__ import annotations

import functools
import io
import json
import wave
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary, SummaryMetadata
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata
from tensorboard.plugins.histogram.summary_v2 import histogram_pb
from tensorboard.plugins.hparams import api_pb2 as hparams_proto
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import plugin_data_pb2 as hparams_data
from tensorboard.plugins.hparams import summary_v2 as hparams_api
from tensorboard.plugins.mesh import metadata as mesh_metadata
from tensorboard.plugins.mesh.plugin_data_pb2 import MeshPluginData
from tensorboard.plugins.pr_curve import metadata as pr_curve_metadata
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.plugins.scalar.summary_v2 import scalar_pb
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.util.tensor_util import make_tensor_proto

Array = np.ndarray[Any, Any]


@functools.cache
def tensorflow_bins() -> tuple[float, ...]:
    """torch's default histogram edges (`bins="tensorflow"`): ±1e-12 growing by 10% up to 1e20, and 0."""
    v = 1e-12
    buckets = []
    while v < 1e20:
        buckets.append(v)
        v *= 1.1
    return (*(-b for b in reversed(buckets)), 0, *buckets)


# ---- scalars, tensors, histograms -------------------------------------------------------------------------


def scalar(name: str, tensor: Any, new_style: bool = False, double_precision: bool = False) -> Summary:
    value = float(tensor)
    if not new_style:
        return Summary(value=[Summary.Value(tag=name, simple_value=value)])
    if not double_precision:
        summary: Summary = scalar_pb(name, value)
        return summary
    proto = make_tensor_proto(np.float64(value))
    return Summary(
        value=[Summary.Value(tag=name, tensor=proto, metadata=scalar_metadata.create_summary_metadata(None, None))]
    )


def tensor_proto(tag: str, tensor: Array) -> Summary:
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="tensor"))
    return Summary(value=[Summary.Value(tag=tag, metadata=metadata, tensor=make_tensor_proto(tensor))])


def histogram(name: str, values: Array, bins: Any, max_bins: int | None = None) -> Summary:
    """TensorBoard's tensor histogram (`histogram_pb`): `bins` as a count, else its default bucket count."""
    buckets = bins if isinstance(bins, int) else max_bins
    summary: Summary = histogram_pb(name, values.astype(np.float64).ravel(), buckets=buckets)
    return summary


def histogram_raw(
    name: str,
    min: float,  # torch's argument names
    max: float,
    num: int,
    sum: float,
    sum_squares: float,
    bucket_limits: Sequence[float],
    bucket_counts: Sequence[float],
) -> Summary:
    hist = HistogramProto(
        min=min, max=max, num=num, sum=sum, sum_squares=sum_squares, bucket_limit=bucket_limits, bucket=bucket_counts
    )
    return Summary(value=[Summary.Value(tag=name, histo=hist)])


# ---- images, video, audio ---------------------------------------------------------------------------------


def to_hwc(image: Array, dataformats: str) -> Array:
    """Reorder an image to height x width x channels; a batch (N) is tiled into one grid image, as torch does."""
    dataformats = dataformats.upper()
    if len(set(dataformats)) != len(dataformats) or image.ndim != len(dataformats):
        raise ValueError(f"image of shape {image.shape} does not match dataformats {dataformats!r}")
    if len(dataformats) == 4:
        return grid(image.transpose([dataformats.index(c) for c in "NCHW"])).transpose(1, 2, 0)
    if len(dataformats) == 2:
        hw = image.transpose([dataformats.index(c) for c in "HW"])
        return np.stack([hw, hw, hw], axis=2)
    hwc = image.transpose([dataformats.index(c) for c in "HWC"])
    if hwc.shape[2] == 1:
        hwc = np.concatenate([hwc, hwc, hwc], axis=2)
    return hwc


def grid(images: Array, columns: int = 8) -> Array:
    """Tile NxCxHxW images row by row into one CxH'xW' image (at most `columns` per row)."""
    if images.shape[1] == 1:
        images = np.concatenate([images, images, images], axis=1)
    count, channels, height, width = images.shape
    columns = max(1, min(count, columns))
    rows = -(-count // columns)
    padded = np.zeros((rows * columns, channels, height, width), dtype=images.dtype)
    padded[:count] = images
    tiles = padded.reshape(rows, columns, channels, height, width)
    return tiles.transpose(2, 0, 3, 1, 4).reshape(channels, rows * height, columns * width)


def to_uint8(image: Array) -> Array:
    """uint8 is taken as [0, 255], anything else as [0, 1]; out-of-range values are clipped."""
    scale = 1 if image.dtype == np.uint8 else 255
    return (image.astype(np.float32) * scale).clip(0, 255).astype(np.uint8)


def make_image(hwc: Array, rescale: float = 1, rois: Array | None = None, labels: Any = None) -> Summary.Image:
    """PNG-encode a height x width x 3/4 uint8 image (boxes drawn first), optionally rescaled."""
    from PIL import Image

    height, width, channels = hwc.shape
    picture = Image.fromarray(hwc)
    if rois is not None:
        picture = draw_boxes(picture, rois, labels)
    picture = picture.resize((int(width * rescale), int(height * rescale)), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=buffer.getvalue())


def draw_boxes(picture: Any, boxes: Array, labels: Sequence[str] | None) -> Any:
    """Red xmin, ymin, xmax, ymax rectangles with optional labels, drawn as torch draws them."""
    from PIL import ImageDraw, ImageFont

    font = ImageFont.load_default()
    draw = ImageDraw.Draw(picture)
    for index in range(boxes.shape[0]):
        left, top, right, bottom = boxes[index, 0], boxes[index, 1], boxes[index, 2], boxes[index, 3]
        draw.line([(left, top), (left, bottom), (right, bottom), (right, top), (left, top)], width=2, fill="Red")
        label = None if labels is None else labels[index]
        if label:
            x0, y0, x1, y1 = font.getbbox(label)
            text_width, text_height = x1 - x0, y1 - y0
            margin = np.ceil(0.05 * text_height)
            draw.rectangle([(left, bottom - text_height - 2 * margin), (left + text_width, bottom)], fill="Red")
            draw.text((left + margin, bottom - text_height - margin), label, fill="black", font=font)
    return picture


def image(tag: str, tensor: Array, rescale: float = 1, dataformats: str = "NCHW") -> Summary:
    hwc = to_uint8(to_hwc(tensor, dataformats))
    return Summary(value=[Summary.Value(tag=tag, image=make_image(hwc, rescale=rescale))])


def image_boxes(
    tag: str,
    tensor_image: Array,
    tensor_boxes: Array,
    rescale: float = 1,
    dataformats: str = "CHW",
    labels: Sequence[str] | None = None,
) -> Summary:
    hwc = to_uint8(to_hwc(tensor_image, dataformats))
    encoded = make_image(hwc, rescale=rescale, rois=tensor_boxes, labels=labels)
    return Summary(value=[Summary.Value(tag=tag, image=encoded)])


def figure_to_image(figures: Any, close: bool = True) -> Array:
    """Render matplotlib figure(s) to uint8 CHW (or NCHW for a list), as torch does; needs matplotlib."""
    import matplotlib.pyplot as plt
    from matplotlib.backends import backend_agg

    def render(figure: Any) -> Array:
        canvas = backend_agg.FigureCanvasAgg(figure)
        canvas.draw()  # type: ignore[no-untyped-call]
        rgba = np.frombuffer(canvas.buffer_rgba(), dtype=np.uint8)  # type: ignore[no-untyped-call]
        width, height = figure.canvas.get_width_height()
        chw = np.moveaxis(rgba.reshape([height, width, 4])[:, :, 0:3], source=2, destination=0)
        if close:
            plt.close(figure)
        return chw

    if isinstance(figures, list):
        return np.stack([render(figure) for figure in figures])
    return render(figures)


def video_frames(video: Array) -> Array:
    """B x T x C x H x W → T x H' x W' x C: the batch tiled into a grid (padded to a power of two), as torch does."""
    batch, frames, channels, height, width = video.shape
    if video.dtype == np.uint8:
        video = video.astype(np.float32) / 255.0
    if batch & (batch - 1):
        padding = np.zeros((2 ** batch.bit_length() - batch, frames, channels, height, width))
        video = np.concatenate((video, padding), axis=0)
    rows = 2 ** ((batch.bit_length() - 1) // 2)
    columns = video.shape[0] // rows
    video = video.reshape(rows, columns, frames, channels, height, width).transpose(2, 0, 4, 1, 5, 3)
    return video.reshape(frames, rows * height, columns * width, channels)


def video(tag: str, tensor: Array, fps: float = 4) -> Summary:
    """An animated GIF, encoded with Pillow (torch needs moviepy 1.x for this)."""
    from PIL import Image

    frames = to_uint8(video_frames(tensor))
    _, height, width, channels = frames.shape
    pictures = [Image.fromarray(frame.squeeze(2) if channels == 1 else frame) for frame in frames]
    buffer = io.BytesIO()
    pictures[0].save(buffer, format="GIF", save_all=True, append_images=pictures[1:], duration=1000.0 / fps, loop=0)
    encoded = Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=buffer.getvalue())
    return Summary(value=[Summary.Value(tag=tag, image=encoded)])


def audio(tag: str, tensor: Array, sample_rate: int = 44100) -> Summary:
    """16-bit mono WAV from samples in [-1, 1] (clipped)."""
    samples = tensor.squeeze()
    if samples.ndim != 1:
        raise ValueError(f"audio must be one channel (shape [L] or [1, L]), got shape {tensor.shape}")
    pcm = (samples.clip(-1, 1) * np.iinfo(np.int16).max).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(pcm.tobytes())
    encoded = Summary.Audio(
        sample_rate=sample_rate,
        num_channels=1,
        length_frames=pcm.shape[-1],
        encoded_audio_string=buffer.getvalue(),
        content_type="audio/wav",
    )
    return Summary(value=[Summary.Value(tag=tag, audio=encoded)])


# ---- text, curves, layouts, meshes, hyperparameters -------------------------------------------------------


def text(tag: str, text: str) -> Summary:
    summary: Summary = text_pb(tag, text)
    return summary


def compute_curve(labels: Array, predictions: Array, num_thresholds: int, weights: Any = None) -> Array:
    """TensorBoard's PR-curve counts: tp, fp, tn, fn, precision, recall at each of `num_thresholds` thresholds."""
    minimum_count = 1e-7
    weights = 1.0 if weights is None else weights
    bucket_indices = np.int32(np.floor(predictions * (num_thresholds - 1)))
    float_labels = labels.astype(np.float64)
    histogram_range = (0, num_thresholds - 1)
    tp_buckets, _ = np.histogram(
        bucket_indices, bins=num_thresholds, range=histogram_range, weights=float_labels * weights
    )
    fp_buckets, _ = np.histogram(
        bucket_indices, bins=num_thresholds, range=histogram_range, weights=(1.0 - float_labels) * weights
    )
    tp = np.cumsum(tp_buckets[::-1])[::-1]
    fp = np.cumsum(fp_buckets[::-1])[::-1]
    tn = fp[0] - fp
    fn = tp[0] - tp
    precision = tp / np.maximum(minimum_count, tp + fp)
    recall = tp / np.maximum(minimum_count, tp + fn)
    return np.stack((tp, fp, tn, fn, precision, recall))


def _pr_curve_summary(tag: str, data: Array, num_thresholds: int) -> Summary:
    metadata = pr_curve_metadata.create_summary_metadata(None, None, num_thresholds)
    tensor = make_tensor_proto(data.astype(np.float32))
    return Summary(value=[Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])


def pr_curve(tag: str, labels: Array, predictions: Array, num_thresholds: int = 127, weights: Any = None) -> Summary:
    num_thresholds = min(num_thresholds, 127)  # as torch: its proto had a limit once
    return _pr_curve_summary(tag, compute_curve(labels, predictions, num_thresholds, weights), num_thresholds)


def pr_curve_raw(
    tag: str,
    tp: Array,
    fp: Array,
    tn: Array,
    fn: Array,
    precision: Array,
    recall: Array,
    num_thresholds: int = 127,
    weights: Any = None,
) -> Summary:
    num_thresholds = min(num_thresholds, 127)
    return _pr_curve_summary(tag, np.stack((tp, fp, tn, fn, precision, recall)), num_thresholds)


def layout_proto(layout: Mapping[str, Mapping[str, Sequence[Any]]]) -> layout_pb2.Layout:
    """`{category: {chart: ["Multiline", tags] | ["Margin", [value, lower, upper]]}}` as a `Layout`."""
    categories = []
    for category, charts in layout.items():
        protos = []
        for title, (kind, tags) in charts.items():
            if kind == "Margin":
                if len(tags) != 3:
                    raise ValueError(f"a Margin chart takes 3 tags (value, lower, upper), got {len(tags)}")
                series = layout_pb2.MarginChartContent.Series(value=tags[0], lower=tags[1], upper=tags[2])
                protos.append(layout_pb2.Chart(title=title, margin=layout_pb2.MarginChartContent(series=[series])))
            else:
                protos.append(layout_pb2.Chart(title=title, multiline=layout_pb2.MultilineChartContent(tag=tags)))
        categories.append(layout_pb2.Category(title=category, chart=protos))
    return layout_pb2.Layout(category=categories)


def custom_scalars(layout: Mapping[str, Mapping[str, Sequence[Any]]]) -> Summary:
    tensor = make_tensor_proto(layout_proto(layout).SerializeToString(), dtype=np.object_)
    metadata = custom_scalar_metadata.create_summary_metadata()
    return Summary(
        value=[Summary.Value(tag=custom_scalar_metadata.CONFIG_SUMMARY_TAG, tensor=tensor, metadata=metadata)]
    )


def mesh(
    tag: str, vertices: Array, colors: Array | None, faces: Array | None, config_dict: dict[str, Any] | None
) -> Summary:
    """The mesh plugin's vertex, face and color tensors (float32, int32, uint8, as TensorBoard's `mesh_pb`)."""
    json_config = "{}" if config_dict is None else json.dumps(config_dict, sort_keys=True)
    parts = [
        (data, content_type, dtype)
        for data, content_type, dtype in (
            (vertices, MeshPluginData.VERTEX, np.float32),
            (faces, MeshPluginData.FACE, np.int32),
            (colors, MeshPluginData.COLOR, np.uint8),
        )
        if data is not None
    ]
    components = mesh_metadata.get_components_bitmask([content_type for _, content_type, _ in parts])
    values = []
    for data, content_type, dtype in parts:
        metadata = mesh_metadata.create_summary_metadata(
            tag, None, content_type, components, data.shape, json_config=json_config
        )
        values.append(
            Summary.Value(
                tag=mesh_metadata.get_instance_name(tag, content_type),
                tensor=make_tensor_proto(data.astype(dtype)),
                metadata=metadata,
            )
        )
    return Summary(value=values)


def hparams(
    hparam_dict: dict[str, Any], metric_dict: dict[str, Any], hparam_domain_discrete: dict[str, list[Any]] | None = None
) -> tuple[Summary, Summary, Summary]:
    """The hparams plugin's experiment, session start and session end summaries (TensorBoard's builders)."""
    if not isinstance(hparam_dict, dict) or not isinstance(metric_dict, dict):
        raise TypeError("hparam_dict and metric_dict should be dictionaries")
    hparam_domain_discrete = hparam_domain_discrete or {}
    for name, domain in hparam_domain_discrete.items():
        if (
            name not in hparam_dict
            or not isinstance(domain, list)
            or not all(isinstance(v, type(hparam_dict[name])) for v in domain)
        ):
            raise TypeError(f"hparam_domain_discrete[{name!r}] should be a list of the type of hparam_dict[{name!r}]")
    values: dict[str, bool | int | float | str] = {}
    for name, value in hparam_dict.items():
        if value is None:
            continue
        if not isinstance(value, bool | int | float | str):
            raise ValueError(f"hparam {name!r}: value should be one of int, float, str, bool, or torch.Tensor")
        values[name] = value
    declared = [
        hparams_api.HParam(
            name, hparams_api.Discrete(hparam_domain_discrete[name]) if name in hparam_domain_discrete else None
        )
        for name in values
    ]
    experiment: Summary = hparams_api.hparams_config_pb(declared, [hparams_api.Metric(tag) for tag in metric_dict])
    start: Summary = hparams_api.hparams_pb(values)
    end_data = hparams_data.HParamsPluginData(
        session_end_info=hparams_data.SessionEndInfo(status=hparams_proto.STATUS_SUCCESS)
    )
    end = Summary(
        value=[
            Summary.Value(
                tag=hparams_metadata.SESSION_END_INFO_TAG,
                metadata=hparams_metadata.create_summary_metadata(end_data),
            )
        ]
    )
    return experiment, start, end
