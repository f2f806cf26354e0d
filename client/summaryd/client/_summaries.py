"""Summary builders on the `tensorboard` package's protos and builders; numpy in, `Summary` out.

These run on the sender thread (the writer hands them copies of the caller's data), so PNG/WAV encoding and
histogram bucketing never cost the training step.
"""

from __future__ import annotations

import io
import wave
from typing import Any

import numpy as np
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.histogram.summary_v2 import histogram_pb
from tensorboard.plugins.text.summary_v2 import text_pb


def to_numpy(value: Any) -> np.ndarray[Any, Any]:
    """A numpy copy of a torch tensor, numpy array, list or number (without importing torch)."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch.Tensor
        return np.array(value.detach().cpu().numpy(), copy=True)
    return np.array(value, copy=True)


def scalar(tag: str, value: float) -> Summary:
    return Summary(value=[Summary.Value(tag=tag, simple_value=value)])


def histogram(tag: str, values: np.ndarray[Any, Any], bins: Any = "tensorflow") -> Summary:
    buckets = bins if isinstance(bins, int) else None
    summary: Summary = histogram_pb(tag, values.astype(np.float64).ravel(), buckets=buckets)
    return summary


def text(tag: str, text_string: str) -> Summary:
    summary: Summary = text_pb(tag, text_string)
    return summary


def to_hwc(image: np.ndarray[Any, Any], dataformats: str) -> np.ndarray[Any, Any]:
    """Reorder an image to height x width x 3/4 channels, as TensorBoard's image tab shows it."""
    dataformats = dataformats.upper()
    if len(set(dataformats)) != len(dataformats) or image.ndim != len(dataformats):
        raise ValueError(f"image of shape {image.shape} does not match dataformats {dataformats!r}")
    if "N" in dataformats:
        nchw = image.transpose([dataformats.index(c) for c in "NCHW"])
        image = grid(nchw)
        dataformats = "CHW"
    if dataformats == "HW":
        return np.stack([image] * 3, axis=2)
    hwc = image.transpose([dataformats.index(c) for c in "HWC"])
    if hwc.shape[2] == 1:
        hwc = np.concatenate([hwc] * 3, axis=2)
    if hwc.shape[2] not in (3, 4):
        raise ValueError(f"an image needs 1, 3 or 4 channels, got {hwc.shape[2]}")
    return hwc


def grid(images: np.ndarray[Any, Any], columns: int = 8) -> np.ndarray[Any, Any]:
    """Tile NxCxHxW images row by row into one CxH'xW' image (at most `columns` per row)."""
    if images.shape[1] == 1:
        images = np.repeat(images, 3, axis=1)
    count, channels, height, width = images.shape
    columns = max(1, min(count, columns))
    rows = -(-count // columns)
    padded = np.zeros((rows * columns, channels, height, width), dtype=images.dtype)
    padded[:count] = images
    tiles = padded.reshape(rows, columns, channels, height, width)
    return tiles.transpose(2, 0, 3, 1, 4).reshape(channels, rows * height, columns * width)


def to_uint8(image: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """uint8 stays; anything else is taken as [0, 1] and scaled to [0, 255]."""
    if image.dtype == np.uint8:
        return image
    return (image.astype(np.float32) * 255.0).clip(0, 255).astype(np.uint8)


def image(tag: str, hwc: np.ndarray[Any, Any]) -> Summary:
    """A PNG image summary from a height x width x 3/4 uint8 array."""
    from PIL import Image

    height, width, channels = hwc.shape
    buffer = io.BytesIO()
    Image.fromarray(hwc).save(buffer, format="PNG")
    encoded = Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=buffer.getvalue())
    return Summary(value=[Summary.Value(tag=tag, image=encoded)])


def audio(tag: str, samples: np.ndarray[Any, Any], sample_rate: int) -> Summary:
    """A 16-bit mono WAV audio summary from samples in [-1, 1]."""
    samples = samples.squeeze()
    if samples.ndim != 1:
        raise ValueError(f"audio must be one channel (shape [L] or [1, L]), got shape {samples.shape}")
    pcm = (samples.astype(np.float64).clip(-1, 1) * 32767.0).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(pcm.tobytes())
    encoded = Summary.Audio(
        sample_rate=sample_rate,
        num_channels=1,
        length_frames=pcm.shape[0],
        encoded_audio_string=buffer.getvalue(),
        content_type="audio/wav",
    )
    return Summary(value=[Summary.Value(tag=tag, audio=encoded)])
