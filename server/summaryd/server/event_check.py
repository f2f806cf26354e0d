"""What a client may send: serialized `Event`s with content, never the records the daemon writes itself."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import chain, repeat
from operator import attrgetter

import google_crc32c
import numpy as np
from google.protobuf.message import DecodeError
from tensorboard.compat.proto.event_pb2 import Event

from summaryd.server.errors import EventError
from summaryd.server.limits import DEFAULT, Limits
from summaryd.v1.wire import header

_INFINITY = float("inf")
_MASK_DELTA = 0xA282EAD8  # TFRecord's CRC mask (see `wire.masked_crc32c`)
_CRC = struct.Struct("<I")
_wall_time = attrgetter("wall_time")


def check_and_frame(events: Sequence[bytes], limits: Limits = DEFAULT) -> bytes:
    """Validate every event of a batch (sizes within `limits`) and return them framed as one blob.

    Each check runs over the whole batch in C-level passes (`map` over the events, numpy over their figures);
    only when one fails does a second pass look at the events one by one, to name the first bad one exactly as
    it would be named alone. A bad event raises before anything is returned, so it refuses its whole batch and
    leaves the event file untouched.

    Raises:
        EventError: naming the first bad event and what is wrong with it.
    """
    blob = _checked_and_framed(events, limits)
    if blob is None:
        _raise_first_problem(events, limits)
        raise AssertionError("a batch failed a check that no single event fails")  # pragma: no cover
    return blob


def _checked_and_framed(events: Sequence[bytes], limits: Limits) -> bytes | None:
    """The batch framed, or None when some event fails a check."""
    if not events:
        return b""
    sizes = list(map(len, events))
    if max(sizes) > limits.max_event_bytes:
        return None
    try:
        parsed = list(map(Event.FromString, events))
    except DecodeError:
        return None
    if not _all_valid(parsed, sizes, limits):
        return None
    crcs = np.fromiter(map(google_crc32c.value, events), dtype=np.uint64, count=len(sizes))
    masked = (((crcs >> np.uint64(15)) | (crcs << np.uint64(17))) + np.uint64(_MASK_DELTA)) & np.uint64(0xFFFFFFFF)
    footers = map(_CRC.pack, masked.tolist())
    return b"".join(chain.from_iterable(zip(map(header, sizes), events, footers, strict=True)))


def _all_valid(parsed: list[Event], sizes: list[int], limits: Limits) -> bool:
    """Whether every parsed event passes the checks after parsing."""
    count = len(parsed)
    # A summary in the `what` oneof answers both "has content" and "is not a file_version record"; HasField is
    # the cheapest look, and a batch of other kinds asks the oneof itself.
    if not all(map(Event.HasField, parsed, repeat("summary", count))):
        whats = set(map(Event.WhichOneof, parsed, repeat("what", count)))
        if None in whats or "file_version" in whats:
            return False
    with np.errstate(invalid="ignore"):
        wall_times = np.fromiter(map(_wall_time, parsed), dtype=np.float64, count=count)
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
    """Raise the error of the first bad event, its checks in the order a client's fix needs them."""
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
