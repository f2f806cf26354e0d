"""Findings beside the curves: `<run>/summaryd` gets the scalar `watch/<rule>` (1 when a finding fires, 0 when it
resolves) at the finding's step, and the text `watch/<rule>/finding` (its summary, naming rank and step).

Written as the daemon's own records (no session) through the run registry, as aggregation writes the run's
`summaryd` counts, one change at a time by a task of its own, outside any batch's path. On a bucket logdir the
run is written only while this daemon holds its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

from summaryd.server.errors import EventError
from summaryd.server.operations.logs import Throttle
from summaryd.server.storage.runs import RunRegistry
from summaryd.server.watch._findings import Finding

log = logging.getLogger(__name__)
_failures = Throttle(log)

STATS_RUN = "summaryd"  # the run aggregation writes its counts to (`aggregation.STATS_RUN`)
_TEXT = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))


def board_events(finding: Finding, wall_time: float) -> list[bytes]:
    """The scalar and the text of one change of `finding`, as serialized events."""
    scalar = Summary.Value(tag=f"watch/{finding.rule}", simple_value=0.0 if finding.resolved_unix else 1.0)
    where = f"{finding.rank} " if finding.rank else ""
    text = f"**{finding.state}** ({where}step {finding.step}): {finding.summary}"
    tensor = TensorProto(dtype=7, tensor_shape=TensorShapeProto(), string_val=[text.encode()])  # 7: DT_STRING
    value = Summary.Value(tag=f"watch/{finding.rule}/finding", metadata=_TEXT, tensor=tensor)
    return [
        Event(wall_time=wall_time, step=finding.step, summary=Summary(value=[scalar])).SerializeToString(),
        Event(wall_time=wall_time, step=finding.step, summary=Summary(value=[value])).SerializeToString(),
    ]


class BoardWriter:
    """Writes each change of a finding to its run's `summaryd` run, in order, from one task."""

    def __init__(self, registry: RunRegistry, may_write: Callable[[str], bool] = lambda run: True) -> None:
        self._registry = registry
        self._may_write = may_write
        self._queue: asyncio.Queue[Finding] = asyncio.Queue(1000)
        self._task: asyncio.Task[None] | None = None

    def tell(self, finding: Finding) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._write_all())
        try:
            self._queue.put_nowait(finding)
        except asyncio.QueueFull:
            _failures.warning("board-full", "watch: finding of run %s not written to TensorBoard", finding.run)

    async def stop(self) -> None:
        """Write what is queued, then stop."""
        if self._task is None:
            return
        await self._queue.join()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    async def _write_all(self) -> None:
        while True:
            finding = await self._queue.get()
            try:
                await self._write(finding)
            except Exception as exc:  # the finding went out by its other ways; the next one is written
                _failures.warning("board", "watch: finding of run %s not written to TensorBoard: %r", finding.run, exc)
            finally:
                self._queue.task_done()

    async def _write(self, finding: Finding) -> None:
        if not self._may_write(finding.run):
            return
        writer = await self._registry.acquire([*finding.run.split("/"), STATS_RUN])
        try:
            await writer.write("", 0, board_events(finding, time.time()))
        except (OSError, EventError) as exc:
            _failures.warning("board-write", "run %s: watch finding not written: %s", writer.run_dir, exc)
        finally:
            closed = await self._registry.release(writer)
            if closed is not None:
                # The daemon's own records have no session marks: nothing to keep the journal for.
                await asyncio.to_thread(closed.finish, True)
