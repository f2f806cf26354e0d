"""The summaryd client: what a training process imports to log to the summaryd daemon.

`SummaryWriter` is a drop-in for `torch.utils.tensorboard.SummaryWriter`; `SummarySaverHook` and
`StepCounterHook` follow `tf.compat.v1.train`'s hooks. Importing this package imports neither the daemon, nor
uvloop, nor TensorFlow, nor torch (`patch()` makes torch's and tensorboardX's writers these when those are
imported): the two hooks are looked up on first access, and are TensorFlow
`SessionRunHook` subclasses when TensorFlow is installed (see `summaryd.client.hooks`).
"""

from summaryd.client._process import _grpc_import  # noqa: F401 - first: before anything imports gRPC (fork handlers)

# isort: split
from typing import TYPE_CHECKING, Any

from summaryd.client._patch import patch
from summaryd.client._sender import DeliveryReport, Sender
from summaryd.client.hooks import (
    GlobalStep,
    MonitoredLoop,
    SecondOrStepTimer,
    SessionRunArgs,
    SessionRunContext,
    SessionRunHook,
    SessionRunValues,
    SummaryWriterCache,
    create_global_step,
    get_global_step,
    reset_global_step,
)
from summaryd.client.writer import SummaryWriter

if TYPE_CHECKING:
    from summaryd.client.hooks import StepCounterHook, SummarySaverHook

__all__ = [
    "DeliveryReport",
    "GlobalStep",
    "MonitoredLoop",
    "SecondOrStepTimer",
    "Sender",
    "SessionRunArgs",
    "SessionRunContext",
    "SessionRunHook",
    "SessionRunValues",
    "StepCounterHook",
    "SummarySaverHook",
    "SummaryWriter",
    "SummaryWriterCache",
    "create_global_step",
    "get_global_step",
    "patch",
    "reset_global_step",
]


def __getattr__(name: str) -> Any:
    # Resolved by `hooks` on first access: importing TensorFlow (when installed) only when a hook is wanted.
    if name in ("StepCounterHook", "SummarySaverHook"):
        from summaryd.client import hooks

        return getattr(hooks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
