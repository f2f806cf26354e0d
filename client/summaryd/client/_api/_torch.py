"""Everything that knows about torch, without importing it: tensors in, numpy copies out; torch's own builders.

torch is never imported here. When the process has imported it (a PyTorch training script always has), the
writer builds every summary with torch's own `torch.utils.tensorboard.summary` functions, so the payloads are
torch's byte for byte and only the transport is ours. A process that has not imported torch never pays for
importing it (seconds and hundreds of megabytes) just because it is installed; it gets `_summaries`' builders.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import numpy as np


def imported() -> Any | None:
    """The `torch` module if this process has imported it, else None."""
    return sys.modules.get("torch")


def builders() -> ModuleType | None:
    """torch's summary builders (`torch.utils.tensorboard.summary`) when torch is imported, else None."""
    if "torch" not in sys.modules:
        return None
    from torch.utils.tensorboard import summary

    module: ModuleType = summary
    return module


def is_tensor(value: Any) -> bool:
    torch = imported()
    return torch is not None and isinstance(value, torch.Tensor)


def to_numpy(value: Any) -> np.ndarray[Any, Any]:
    """A numpy copy of what a caller logs, read the way torch's `make_np` reads it.

    A torch tensor is detached and brought to the CPU (bfloat16 becomes float16, as in torch); a Python or numpy
    number becomes a one-element array; lists are accepted too (torch refuses them). The result never shares
    memory with the caller's object, so the caller may change it right after the call.
    """
    torch = imported()
    if torch is not None and isinstance(value, torch.Tensor):
        tensor = value.detach()
        if tensor.dtype == torch.bfloat16:
            return np.asarray(tensor.to(torch.float16).cpu().numpy())  # the conversion made a copy
        if tensor.device.type == "cpu":
            return np.array(tensor.numpy(), copy=True)  # .numpy() of a CPU tensor shares its memory
        return np.asarray(tensor.cpu().numpy())  # the device-to-host transfer made a copy
    if isinstance(value, np.ndarray):
        return value.copy()
    if np.isscalar(value):
        return np.array([value])
    return np.array(value)


def to_float(value: Any) -> float:
    """The one number of a scalar (Python or numpy number, one-element tensor or array)."""
    if isinstance(value, int | float):
        return float(value)
    array = to_numpy(value).squeeze()
    if array.ndim != 0:
        raise ValueError(f"a scalar needs exactly one element, got {array.size} (shape {array.shape})")
    return float(array)


def tensor_copy(value: Any) -> Any:
    """A CPU copy of a tensor for `add_tensor` (torch's builder reads the torch dtype); numpy becomes a tensor."""
    torch = imported()
    assert torch is not None
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    return torch.from_numpy(to_numpy(value))


_video_encoder: bool | None = None


def can_encode_video() -> bool:
    """torch's `make_video` needs moviepy 1.x (`moviepy.editor`); without it torch logs an empty value."""
    global _video_encoder
    if _video_encoder is None:
        try:
            import moviepy.editor  # type: ignore[import-untyped]  # noqa: F401
        except Exception:  # ImportError, or moviepy failing on its own dependencies
            _video_encoder = False
        else:
            _video_encoder = True
    return _video_encoder


def graph(model: Any, input_to_model: Any, verbose: bool, use_strict_trace: bool) -> tuple[Any, Any]:
    """Trace a module with torch's own tracer: `(GraphDef, RunMetadata)`."""
    from torch.utils.tensorboard._pytorch_graph import graph as trace

    traced: tuple[Any, Any] = trace(model, input_to_model, verbose, use_strict_trace)
    return traced


def onnx_graph(path: str) -> Any:
    """Read an ONNX model file into a `GraphDef` with torch's own converter (needs torch and onnx)."""
    from torch.utils.tensorboard._onnx_graph import load_onnx_graph

    return load_onnx_graph(path)
