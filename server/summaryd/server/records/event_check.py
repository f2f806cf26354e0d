"""What a client may send: serialized `Event`s with content, never the records the daemon writes itself."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from itertools import chain, repeat

import google_crc32c
import numpy as np
from google.protobuf.message import DecodeError
from numpy.typing import NDArray
from tensorboard.compat.proto.event_pb2 import Event

from summaryd.server.errors import EventError
from summaryd.server.records.private_messages import Kind, repeated_messages
from summaryd.server.records.scalar_events import USUAL_FROM, EventBatch, UsualBatch, read_usual
from summaryd.server.security.limits import DEFAULT, Limits
from summaryd.v1.wire import header

_INFINITY = float("inf")
_MASK_DELTA = 0xA282EAD8  # TFRecord's CRC mask (see `wire.masked_crc32c`)
_CRC = struct.Struct("<I")
_FEW_RUNS = 8  # a large batch is framed in runs of one size when it has fewer runs than an eighth of its events


# `Blobs` and `Events` are the same bytes on the wire (a field of field number 1, one length-delimited element per
# event): a batch put into `Blobs` by C and parsed as `Events` is every event parsed by one C call. `WallTimes`
# reads the events joined as one message: field 1 of `Event`, `wall_time`, of every event.
_Blobs, _Events, _WallTimes = repeated_messages(
    "summaryd/server/event_check_batch.proto",
    "summaryd.server.records.event_check",
    {
        "Blobs": [("event", 1, Kind.TYPE_BYTES, "")],
        "Events": [("event", 1, Kind.TYPE_MESSAGE, f".{Event.DESCRIPTOR.full_name}")],
        "WallTimes": [("wall_time", 1, Kind.TYPE_DOUBLE, "")],
    },
    depends_on=[Event.DESCRIPTOR.file.name],
)


def check_and_frame(events: Sequence[bytes], limits: Limits = DEFAULT) -> bytes:
    """Validate every event of a batch (sizes within `limits`) and return them framed as one blob.

    A large batch of the usual scalar events is checked from its bytes (`scalar_events.read_usual`, which an
    `EventBatch` keeps for the write observers); any other is checked whole (`_all_valid`: one C parse
    of every event, C-level passes over what was parsed, numpy over sizes and wall times). A batch that does not
    pass is looked at event by event, which names the first bad event exactly as it would be named alone; a bad
    event raises before anything is returned, so it refuses its whole batch and leaves the event file untouched.

    Raises:
        EventError: naming the first bad event and what is wrong with it.
    """
    if not events:
        return b""
    sizes = list(map(len, events))
    if len(sizes) < USUAL_FROM:
        if not _all_valid(events, sizes, limits):
            # Mostly a bad event, which raises; also a batch the whole-batch checks could not decide (an event
            # nested to the parser's depth limit, field 1 sent packed), which passes here.
            _raise_first_problem(events, limits)
        return _joined(events, sizes)
    if _usual_valid(events, sizes, limits) is None and not _all_valid(events, sizes, limits):
        _raise_first_problem(events, limits)
    return _framed_in_runs(events, sizes)


def _masked_crcs(events: Sequence[bytes]) -> NDArray[np.uint64]:
    """Each event's masked CRC-32C (one google-crc32c call each: it has no batch API)."""
    crcs = np.fromiter(map(google_crc32c.value, events), dtype=np.uint64, count=len(events))
    masked: NDArray[np.uint64] = (
        ((crcs >> np.uint64(15)) | (crcs << np.uint64(17))) + np.uint64(_MASK_DELTA)
    ) & np.uint64(0xFFFFFFFF)
    return masked


def _joined(events: Sequence[bytes], sizes: list[int]) -> bytes:
    """The records framed one by one and joined: a small batch."""
    footers = map(_CRC.pack, _masked_crcs(events).tolist())
    return b"".join(chain.from_iterable(zip(map(header, sizes), events, footers, strict=True)))


def _framed_in_runs(events: Sequence[bytes], sizes: list[int]) -> bytes:
    """The records framed as one blob built by numpy: each run of events of one size is a matrix of rows
    `header | event | footer` (its header the same for every row), its events' bytes copied in at once. A batch
    of events of many sizes in turn is joined record by record."""
    lengths = np.array(sizes, dtype=np.int64)
    edges = np.flatnonzero(lengths[1:] != lengths[:-1]) + 1
    if len(edges) * _FEW_RUNS >= len(sizes):
        return _joined(events, sizes)
    footers = _masked_crcs(events).astype("<u4").view(np.uint8).reshape(-1, 4)
    data = np.frombuffer(b"".join(events), dtype=np.uint8)
    blob = np.empty(len(data) + 16 * len(sizes), dtype=np.uint8)
    read = written = 0
    for first, stop in itertools.pairwise([0, *edges.tolist(), len(sizes)]):
        size, count = sizes[first], stop - first
        rows = blob[written : written + count * (size + 16)].reshape(count, size + 16)
        rows[:, :12] = np.frombuffer(header(size), dtype=np.uint8)
        rows[:, 12 : 12 + size] = data[read : read + count * size].reshape(count, size)
        rows[:, 12 + size :] = footers[first:stop]
        read, written = read + count * size, written + count * (size + 16)
    return blob.tobytes()


def _usual_valid(events: Sequence[bytes], sizes: list[int], limits: Limits) -> UsualBatch | None:
    """The batch read as usual events (`scalar_events`) when it is and each passes (an `EventBatch` keeps it). A
    usual event parses as an `Event` with a summary by its layout, so what is left to check is its numbers:
    sizes, wall times and tags."""
    usual = read_usual(events)
    if isinstance(events, EventBatch):
        events.read_as_usual = True
    if usual is None:
        return None
    with np.errstate(invalid="ignore"):
        wall_times_valid = bool(((usual.wall_times >= 0.0) & (usual.wall_times < _INFINITY)).all())
    if not (wall_times_valid and max(sizes) <= limits.max_event_bytes and usual.longest_tag <= limits.max_tag_bytes):
        return None
    if isinstance(events, EventBatch):
        events.usual = usual
    return usual


def _all_valid(events: Sequence[bytes], sizes: list[int], limits: Limits) -> bool:
    """Whether every event surely passes every check; False when one fails or when this cannot tell."""
    if max(sizes) > limits.max_event_bytes:
        return False
    try:
        # One C parse of the whole batch: what validating a client's bytes means (each is an `Event`).
        parsed = _Events.FromString(_Blobs(event=events).SerializeToString()).event  # type: ignore[call-arg,attr-defined]
        # Every `wall_time` field of every event: when all of them are valid, so is each event's (the last).
        wall_times = np.array(_WallTimes.FromString(b"".join(events)).wall_time, dtype=np.float64)  # type: ignore[attr-defined]
    except DecodeError:
        return False
    count = len(sizes)
    # A summary in the `what` oneof answers both "has content" and "is not a file_version record"; HasField is
    # the cheapest look, and a batch of other kinds asks the oneof itself.
    if not all(map(Event.HasField, parsed, repeat("summary", count))):
        whats = set(map(Event.WhichOneof, parsed, repeat("what", count)))
        if None in whats or "file_version" in whats:
            return False
    with np.errstate(invalid="ignore"):
        if not ((wall_times >= 0.0) & (wall_times < _INFINITY)).all():  # NaN fails both
            return False
    # A tag is part of its event: an event no longer than the limit cannot hold a tag over it.
    return max(sizes) <= limits.max_tag_bytes or not any(
        _tag_problem(event, size, limits) for event, size in zip(parsed, sizes, strict=True)
    )


def _tag_problem(event: Event, size: int, limits: Limits) -> str | None:
    """What is wrong with the event's tags, if anything."""
    max_tag = limits.max_tag_bytes
    if size <= max_tag or event.WhichOneof("what") != "summary":
        return None
    for value in event.summary.value:
        # A tag of n characters has at most 4n UTF-8 bytes: most tags need no encoding to pass.
        if len(value.tag) * 4 > max_tag and len(value.tag.encode()) > max_tag:
            return f"has a tag of {len(value.tag.encode())} bytes, over the limit of {max_tag} bytes (--max-tag-bytes)"
    return None


def _raise_first_problem(events: Sequence[bytes], limits: Limits) -> None:
    """Raise the error of the first bad event, its checks in the order a client's fix needs them; return when
    every event passes."""
    event = Event()
    max_event = limits.max_event_bytes
    for index, data in enumerate(events):
        size = len(data)
        if size > max_event:
            raise EventError(index, f"is {size} bytes, over the limit of {max_event} bytes (--max-event-bytes)")
        try:
            event.ParseFromString(data)
        except DecodeError:
            raise EventError(index, "is not a serialized tensorboard Event") from None
        what = event.WhichOneof("what")
        if what is None:
            raise EventError(index, "carries nothing (no summary, session_log, graph or metadata)")
        if what == "file_version":
            raise EventError(index, "sets file_version; the daemon writes that record itself")
        wall_time = event.wall_time
        if not 0.0 <= wall_time < _INFINITY:  # also false for NaN
            raise EventError(index, f"has wall_time {wall_time}; use the client's clock in seconds")
        problem = _tag_problem(event, size, limits)
        if problem is not None:
            raise EventError(index, problem)
