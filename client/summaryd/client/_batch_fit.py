"""Batches cut to what the daemon takes: it states its limits when a session opens, and a batch over them would
be refused whole (and resent forever, when the refusal is about size)."""

from __future__ import annotations

from dataclasses import dataclass

from summaryd.v1 import summaryd_pb2 as pb

# What a WriteRequest carries besides its events: the session id (a field of tag, length and text) and the first
# sequence number (tag and a varint of at most 10 bytes).
_HEADER_BYTES = 2 + 10 + 1
# Tag and length of one event up to 32 GiB.
_MAX_FIELD_OVERHEAD = 1 + 5


def field_bytes(payload: int) -> int:
    """Size on the wire of one `repeated bytes` element of `payload` bytes (tag, varint length, payload)."""
    return 1 + max(1, (payload.bit_length() + 6) // 7) + payload


@dataclass(frozen=True)
class DaemonLimits:
    """What a daemon takes; 0: not stated (an older daemon), no limit known."""

    max_message_bytes: int = 0
    max_event_bytes: int = 0
    max_batch_events: int = 0

    @classmethod
    def of(cls, answer: pb.OpenSessionResponse) -> DaemonLimits:
        return cls(answer.max_message_bytes, answer.max_event_bytes, answer.max_batch_events)

    def fit(self, events: list[bytes], nbytes: int, session_id: str) -> tuple[list[list[bytes]], list[bytes]]:
        """`events` (of `nbytes` together) in order, cut into batches that the daemon takes, and the events that
        no batch can carry."""
        too_large: list[bytes] = []
        return self._cut(events, nbytes, session_id, too_large), too_large

    def split(self, events: list[bytes], nbytes: int, session_id: str) -> list[list[bytes]]:
        """As `fit`, for events numbered already, which cannot be dropped here (a batch spooled, or made before
        the daemon's limits shrank): an event too large for any message goes alone, for the daemon to refuse."""
        return self._cut(events, nbytes, session_id, None)

    def _cut(
        self, events: list[bytes], nbytes: int, session_id: str, too_large: list[bytes] | None
    ) -> list[list[bytes]]:
        room = self.max_message_bytes - _HEADER_BYTES - len(session_id.encode()) if self.max_message_bytes else 0
        most = self.max_batch_events
        fits_whole = (
            (not room or nbytes + _MAX_FIELD_OVERHEAD * len(events) <= room)
            and (not most or len(events) <= most)
            and (not self.max_event_bytes or nbytes <= self.max_event_bytes)
        )
        if fits_whole:  # the usual case, decided without a look at each event
            return [events] if events else []
        batches: list[list[bytes]] = []
        batch: list[bytes] = []
        size = 0
        for event in events:
            wire = field_bytes(len(event))
            if (self.max_event_bytes and len(event) > self.max_event_bytes) or (room and wire > room):
                if too_large is not None:
                    too_large.append(event)
                    continue
                if batch:
                    batches.append(batch)
                batches.append([event])
                batch, size = [], 0
                continue
            if batch and ((room and size + wire > room) or (most and len(batch) == most)):
                batches.append(batch)
                batch, size = [], 0
            batch.append(event)
            size += wire
        if batch:
            batches.append(batch)
        return batches
