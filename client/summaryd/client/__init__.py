"""The summaryd client: what a training process imports to log to the summaryd daemon.

`SummaryWriter` is a drop-in for `torch.utils.tensorboard.SummaryWriter`; `SummarySaverHook` and
`StepCounterHook` follow `tf.compat.v1.train`'s hooks. Importing this package imports neither the daemon, nor
uvloop, nor TensorFlow, nor torch.
"""

from summaryd.client._sender import DeliveryReport, Sender
from summaryd.client.hooks import (
    GlobalStep,
    MonitoredLoop,
    SecondOrStepTimer,
    SessionRunArgs,
    SessionRunContext,
    SessionRunHook,
    SessionRunValues,
    StepCounterHook,
    SummarySaverHook,
    SummaryWriterCache,
    create_global_step,
    get_global_step,
    reset_global_step,
)
from summaryd.client.writer import SummaryWriter

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
    "reset_global_step",
]
