"""The writers compared: summaryd's client, torch's `SummaryWriter` and tensorboardX's, behind one small shape.

Imported in the trial processes only; each peer is imported when its writer is opened, so a trial pays only
for what it uses (and does so before the timed part starts).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

SUMMARYD = "summaryd"
TORCH = "torch"
TENSORBOARDX = "tensorboardX"
SUMMARYD_HOOK = "summaryd-hook"
"""summaryd's `SummarySaverHook(save_steps=1)`: each call is one step's `before_run` and `after_run`."""
NO_WRITER = "none"
"""An empty function in place of `add_scalar`: the floor of what timing one call costs on this machine."""
DEQUE = "deque"
"""A function in place of `add_scalar` that appends the tuple a queued scalar is (its kind, tag, value, step, wall
time, estimated bytes) to a deque: the floor of what queueing a scalar for another thread costs."""

# The labels of the contenders in the tables.
LIVE = "summaryd, daemon live"
ABSENT = "summaryd, no daemon"
PEERS = {"torch": TORCH, "tensorboardX": TENSORBOARDX}
HOOK = "summaryd SummarySaverHook, daemon live"
FLOOR = "empty function (floor)"
QUEUE_FLOOR = "a tuple into a deque (floor)"


@dataclass(frozen=True)
class WriterSpec:
    """Which writer to open, and where it writes.

    `target` is the run path under the daemon's logdir for summaryd, a local log directory for the peers.
    """

    kind: str
    target: str
    address: str = ""
    worker: str = ""
    world_size: int = 1
    close_timeout: float = 120.0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WriterSpec:
        return cls(**data)


@dataclass(frozen=True)
class Closed:
    """What a writer's `close()` said: -1 where the writer does not report delivery."""

    delivered: int
    undelivered: int
    synced: bool


@dataclass(frozen=True)
class OpenWriter:
    """`add_scalar` is the writer's own bound method (nothing in between); `close` returns when the writer has;
    `writer` is the writer itself, for its other methods (None for the empty function)."""

    add_scalar: Callable[[str, float, int], None]
    close: Callable[[], Closed]
    writer: Any = None


def import_training_runtime() -> None:
    """Import torch, as a training process would have, so that every contender runs with the same heap.

    The size of the heap decides how long Python's full garbage collections take, which shows in the
    slowest calls of every contender.
    """
    import torch  # noqa: F401


def open_writer(spec: WriterSpec) -> OpenWriter:
    if spec.kind == SUMMARYD:
        return _summaryd(spec)
    if spec.kind == TORCH:
        from torch.utils.tensorboard import SummaryWriter as TorchWriter

        torch_writer = TorchWriter(log_dir=spec.target)
        return OpenWriter(torch_writer.add_scalar, _unreported(torch_writer.close), torch_writer)
    if spec.kind == SUMMARYD_HOOK:
        return _summaryd_hook(spec)
    if spec.kind == NO_WRITER:
        return OpenWriter(_nothing, _unreported(lambda: None))
    if spec.kind == DEQUE:
        return _deque_floor()
    if spec.kind == TENSORBOARDX:
        from tensorboardX import SummaryWriter as XWriter  # type: ignore[import-untyped]

        x_writer = XWriter(logdir=spec.target)
        return OpenWriter(x_writer.add_scalar, _unreported(x_writer.close), x_writer)
    raise ValueError(f"unknown writer {spec.kind!r}")


def _summaryd(spec: WriterSpec) -> OpenWriter:
    from summaryd.client import SummaryWriter

    writer = SummaryWriter(spec.target, spec.address, worker=spec.worker, world_size=spec.world_size)

    def close() -> Closed:
        report = writer.close(timeout=spec.close_timeout)
        return Closed(report.delivered, report.undelivered, report.synced)

    return OpenWriter(writer.add_scalar, close, writer)


def _summaryd_hook(spec: WriterSpec) -> OpenWriter:
    """A step of a TF-style loop as `MonitoredLoop` drives it, the hook saving every step: `before_run`, then
    `after_run` with the global step and the summary op's result (a serialized `Summary` of one scalar, what a
    TensorFlow summary op yields); the step's own work is left out."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    from summaryd.client import SummaryWriter
    from summaryd.client.hooks import (
        LoopSession,
        PlainSummarySaverHook,
        SessionRunArgs,
        SessionRunContext,
        SessionRunValues,
        create_global_step,
    )

    writer = SummaryWriter(spec.target, spec.address)
    global_step = create_global_step()
    summary = Summary(value=[Summary.Value(tag="loss", simple_value=0.5)]).SerializeToString()
    hook = PlainSummarySaverHook(save_steps=1, summary_writer=writer, summary_op=lambda: summary)
    session = LoopSession()
    hook.begin()
    hook.after_create_session(session, None)
    context = SessionRunContext(SessionRunArgs(None), session)

    def step(tag: str, value: float, number: int) -> None:
        hook.before_run(context)
        hook.after_run(context, SessionRunValues(results={"global_step": number, "summary": [summary]}))
        global_step.increment()

    def close() -> Closed:
        hook.end(session)
        report = writer.close(timeout=spec.close_timeout)
        return Closed(report.delivered, report.undelivered, report.synced)

    return OpenWriter(step, close, writer)


def _unreported(close: Callable[[], object]) -> Callable[[], Closed]:
    def closed() -> Closed:
        close()
        return Closed(-1, -1, False)

    return closed


def _nothing(tag: str, value: float, step: int) -> None:
    """Takes what `add_scalar` takes and does nothing."""


def _deque_floor() -> OpenWriter:
    import time
    from collections import deque

    queue: deque[tuple[int, str, float, int, float, int]] = deque()
    append, now = queue.append, time.time

    def add_scalar(tag: str, value: float, step: int) -> None:
        append((2, tag, value, step, now(), 24 + len(tag)))

    return OpenWriter(add_scalar, _unreported(queue.clear), queue)
