"""Everything that knows about torch, without importing it: tensors in, numpy copies out; torch's own builders.

torch is never imported here. When the process has imported it (a PyTorch training script always has), the
writer builds every summary with torch's own `torch.utils.tensorboard.summary` functions, so the payloads are
torch's byte for byte and only the transport is ours. A process that has not imported torch never pays for
importing it (seconds and hundreds of megabytes) just because it is installed; it gets `_summaries`' builders.

Nor does it pay for TensorFlow: importing any module of `torch.utils.tensorboard` runs the package's
`__init__`, which imports torch's writer, whose `_embedding` imports TensorFlow when it is installed (seconds,
gigabytes, and threads of its own that a forked DataLoader worker inherits in whatever state they were: such a
worker was seen to crash). So unless the process imported `torch.utils.tensorboard` itself, the modules used
here (the builders and the graph tracers, none of which needs TensorFlow) are loaded from torch's files into a
package of summaryd's own (`_tensorboard_module`), which has no such `__init__`.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
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
    return _tensorboard_module("summary")


def tensorboard_imported() -> bool:
    """Whether the process imported `torch.utils.tensorboard` (and TensorFlow with it, when installed)."""
    return _TENSORBOARD in sys.modules


_TENSORBOARD = "torch.utils.tensorboard"
_OWN_COPY = "summaryd.client._api._torch_tensorboard"
"""The package torch's tensorboard modules are loaded into when the process has not imported torch's."""


def _tensorboard_module(name: str) -> ModuleType:
    """torch's `torch.utils.tensorboard.<name>`: the process's own when it imported the package, else the same
    file loaded below `_OWN_COPY` (its relative imports, `._convert_np` and the like, land there too), without
    the package's `__init__` and the TensorFlow it would import."""
    if _TENSORBOARD in sys.modules:
        return importlib.import_module(f"{_TENSORBOARD}.{name}")
    if _OWN_COPY not in sys.modules:
        found = importlib.util.find_spec(_TENSORBOARD)  # finds the package's directory, runs none of it
        assert found is not None and found.submodule_search_locations is not None
        spec = importlib.machinery.ModuleSpec(_OWN_COPY, None, is_package=True)
        spec.submodule_search_locations = list(found.submodule_search_locations)
        sys.modules[_OWN_COPY] = importlib.util.module_from_spec(spec)
    return importlib.import_module(f"{_OWN_COPY}.{name}")


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
    trace = _tensorboard_module("_pytorch_graph").graph
    traced: tuple[Any, Any] = trace(model, input_to_model, verbose, use_strict_trace)
    return traced


def onnx_graph(path: str) -> Any:
    """Read an ONNX model file into a `GraphDef` with torch's own converter (needs torch and onnx)."""
    return _tensorboard_module("_onnx_graph").load_onnx_graph(path)
