"""`SummarySaverHook` and `StepCounterHook` with TensorFlow's semantics, for TensorFlow or any training loop.

These follow `tf.compat.v1.train`'s hooks: the same constructor arguments and errors, the timer that fires on
its first call, one `SessionLog.START` on the first `after_run`, summaries at the global step read after the
run, and `end()` flushing the writer (here: until the daemon has synced it).

`SummarySaverHook` and `StepCounterHook` are resolved on first access (module `__getattr__`): when TensorFlow is
installed they are the `tf.compat.v1.train.SessionRunHook` subclasses of `summaryd.client._api._tf`, which run inside
`MonitoredTrainingSession`; otherwise they are `PlainSummarySaverHook` and `PlainStepCounterHook`. Importing this
module never imports TensorFlow; only touching those two names does.

Without TensorFlow, `MonitoredLoop` drives the same lifecycle (`begin`, `after_create_session`, `before_run`,
`after_run`, `end`) around a plain Python step function; a `summary_op` is then a callable returning a
`Summary`, its serialized bytes, or a mapping of tag to scalar.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING, Any

from summaryd.client._api._hooks import (
    GlobalStep,
    LoopSession,
    MonitoredLoop,
    PlainStepCounterHook,
    PlainSummarySaverHook,
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

# Not the two hooks: they resolve on first access, and `import *` should not import TensorFlow.
__all__ = [
    "GlobalStep",
    "LoopSession",
    "MonitoredLoop",
    "PlainStepCounterHook",
    "PlainSummarySaverHook",
    "SecondOrStepTimer",
    "SessionRunArgs",
    "SessionRunContext",
    "SessionRunHook",
    "SessionRunValues",
    "SummaryWriterCache",
    "create_global_step",
    "get_global_step",
    "reset_global_step",
]

log = logging.getLogger("summaryd.client")


if TYPE_CHECKING:
    SummarySaverHook = PlainSummarySaverHook
    StepCounterHook = PlainStepCounterHook


def _hook_classes() -> dict[str, type[SessionRunHook]]:
    """The TensorFlow hook classes when TensorFlow is installed (importing it), else the plain ones."""
    if importlib.util.find_spec("tensorflow") is not None:
        try:
            from summaryd.client._api import _tf
        except ImportError as e:  # an installed but broken TensorFlow: the hooks still work without it
            log.warning("TensorFlow is installed but does not import (%s); the hooks work without it", e)
        else:
            return {"SummarySaverHook": _tf.SummarySaverHook, "StepCounterHook": _tf.StepCounterHook}
    return {"SummarySaverHook": PlainSummarySaverHook, "StepCounterHook": PlainStepCounterHook}


def __getattr__(name: str) -> Any:
    # `SummarySaverHook` and `StepCounterHook` are chosen on first access, so that importing this module (and
    # `summaryd.client`) does not import TensorFlow; the choice is then kept in the module's namespace.
    if name in ("SummarySaverHook", "StepCounterHook"):
        globals().update(_hook_classes())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
