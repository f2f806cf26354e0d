"""Which session sequence numbers each uploaded segment holds, written with the segment itself.

A session's durable watermark is written to its state in the bucket after the segment that holds its events
(`sessions`); a daemon lost between the two leaves events in the bucket that the state does not count.
So every segment carries, as user metadata of its one PUT (it arrives with the object or not at all), the
highest sequence number of each session with events in it. A daemon resuming a session from the bucket reads
the metadata of the run's segments newer than the state's `since` key, newest first, and starts the session
at the higher of the two: the client's resend of what the state did not count is dropped, not written twice.

Session ids are written as a 64-bit hash (the metadata of an object is small: 2 KiB on S3), at most
`MAX_SESSIONS` per segment; a segment ends early rather than leave a session out. The segments are read by
`segments.SegmentIndex`.
"""

from __future__ import annotations

import base64
import hashlib

ATTRIBUTE = "summaryd-sessions"
"""The user metadata field of a segment: `TAG:LAST` per session, comma-separated."""
MAX_SESSIONS = 64
"""Sessions one segment may name: 64 entries of at most 32 bytes stay well within S3's 2 KiB of metadata."""


def session_tag(session_id: str) -> str:
    """The short name of a session in a segment's metadata (11 characters, URL-safe)."""
    digest = hashlib.blake2b(session_id.encode(), digest_size=8).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def encode(held: dict[str, int]) -> str:
    """The metadata value for a segment holding each session of `held` up to its sequence number."""
    return ",".join(f"{session_tag(session_id)}:{last}" for session_id, last in sorted(held.items()))


def decode(value: str) -> dict[str, int]:
    """`{tag: last}` of a metadata value; entries that do not parse are skipped."""
    held: dict[str, int] = {}
    for entry in value.split(","):
        tag, _, last = entry.partition(":")
        if tag and last.isdigit():
            held[tag] = max(held.get(tag, 0), int(last))
    return held
