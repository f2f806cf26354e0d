"""Queued scalars as columns: what a batch of them carries to a daemon that builds their events itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from summaryd.client._encoder import EventEncoder
from summaryd.v1 import summaryd_pb2 as pb


@dataclass(frozen=True, eq=False)
class ScalarRun:
    """A run of queued scalars `(tag, value, step, wall_time, estimated bytes)` as columns, in queue order.

    Made per batch with a handful of C-level operations (no `Event` per scalar); `tags` holds each tag once,
    `tag_index` points into it.
    """

    tags: Sequence[str]
    tag_index: Sequence[int]
    values: Sequence[float]
    steps: Sequence[int]
    wall_times: Sequence[float]

    @classmethod
    def of(cls, items: Sequence[tuple[Any, ...]]) -> ScalarRun:
        tags, values, steps, wall_times, _ = zip(*items, strict=True)
        table = {tag: index for index, tag in enumerate(dict.fromkeys(tags))}
        return cls(tuple(table), list(map(table.__getitem__, tags)), values, steps, wall_times)

    def __len__(self) -> int:
        return len(self.steps)

    def message(self) -> pb.ScalarColumns:
        """The columns as the write request carries them."""
        return pb.ScalarColumns(
            tags=self.tags, tag_index=self.tag_index, step=self.steps, wall_time=self.wall_times, value=self.values
        )

    def encoded(self) -> list[bytes]:
        """The serialized events, byte for byte what the daemon builds from the columns: for the spool, an
        older daemon, a batch cut to smaller limits, or a refusal."""
        encoder = EventEncoder()
        tags = self.tags
        return [
            encoder.scalar((tags[which], value, step, wall_time))
            for which, value, step, wall_time in zip(
                self.tag_index, self.values, self.steps, self.wall_times, strict=True
            )
        ]
