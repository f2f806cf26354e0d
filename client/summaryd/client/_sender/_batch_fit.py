"""Batches cut to what the daemon takes: it states its limits when a session opens, and a batch over them would
be refused whole (and resent forever, when the refusal is about size). Events that no message can carry are
sorted out before they are numbered; every batch is split into messages as it is sent."""

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
    # Whether it builds scalar events from columns (`WriteRequest.scalars`); older daemons do not.
    takes_scalar_columns: bool = False
    # Whether it takes their steps as fixed 8-byte integers (`ScalarColumns.fixed_step`).
    takes_fixed_steps: bool = False

    @classmethod
    def of(cls, answer: pb.OpenSessionResponse) -> DaemonLimits:
        return cls(
            answer.max_message_bytes,
            answer.max_event_bytes,
            answer.max_batch_events,
            answer.takes_scalar_columns,
            answer.takes_fixed_steps,
        )

    def carries_whole(self, count: int, nbytes: int) -> bool:
        """Whether one message carries a batch of `count` scalar columns of about `nbytes` as it is."""
        most, room = self.max_batch_events, self.max_message_bytes
        return (not most or count <= most) and (not room or 2 * nbytes < room)

    def sort_out(self, events: list[bytes], nbytes: int, session_id: str) -> tuple[list[bytes], list[bytes]]:
        """`events` (of `nbytes` together) that a message can carry, in order, and those none can: to be dropped
        before they are numbered."""
        room = self._room(session_id)
        if self._fit_in_one(events, nbytes, room):
            return events, []  # the usual case, decided without a look at each event
        kept: list[bytes] = []
        too_large: list[bytes] = []
        for event in events:
            (too_large if self._too_large(event, room) else kept).append(event)
        return kept, too_large

    def split(self, events: list[bytes], nbytes: int, session_id: str) -> list[list[bytes]]:
        """`events` (of `nbytes` together) in order, cut into messages the daemon takes. They are numbered
        already and cannot be dropped here: an event too large for any message goes alone, for the daemon to
        refuse by its rules."""
        room = self._room(session_id)
        most = self.max_batch_events
        if self._fit_in_one(events, nbytes, room) and (not most or len(events) <= most):
            return [events] if events else []  # the usual case, decided without a look at each event
        batches: list[list[bytes]] = []
        batch: list[bytes] = []
        size = 0
        for event in events:
            wire = field_bytes(len(event))
            alone = self._too_large(event, room)
            if batch and (alone or (room and size + wire > room) or (most and len(batch) == most)):
                batches.append(batch)
                batch, size = [], 0
            batch.append(event)
            size += wire
            if alone:
                batches.append(batch)
                batch, size = [], 0
        if batch:
            batches.append(batch)
        return batches

    def _room(self, session_id: str) -> int:
        """Bytes a message has for its events; 0: no limit known."""
        return self.max_message_bytes - _HEADER_BYTES - len(session_id.encode()) if self.max_message_bytes else 0

    def _fit_in_one(self, events: list[bytes], nbytes: int, room: int) -> bool:
        """Whether `events` (of `nbytes`) fit one message by their size, judged from the total alone (no event
        is larger than all of them together)."""
        return (not self.max_event_bytes or nbytes <= self.max_event_bytes) and (
            not room or nbytes + _MAX_FIELD_OVERHEAD * len(events) <= room
        )

    def _too_large(self, event: bytes, room: int) -> bool:
        return bool(
            (self.max_event_bytes and len(event) > self.max_event_bytes) or (room and field_bytes(len(event)) > room)
        )
