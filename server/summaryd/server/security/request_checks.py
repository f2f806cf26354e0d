"""Bounds on every integer and string a client sends, checked at the edge before anything is stored or shown.

A value the daemon keeps (a session's identity, its sequence numbers) is echoed by `GetStatus`, written to the
session store and quoted in logs, so one client's oversized or out-of-range value would fail those for every
caller. Each check returns the one-line reason for `INVALID_ARGUMENT` (naming the field and what it may be), or
None when the request is fine. Run paths, worker labels and file paths have their own rules (`runpath`).
"""

from __future__ import annotations

from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1.wire import column_steps

MAX_SEQUENCE = 2**63 - 1
"""Highest sequence number: every sequence, sum and count derived from one fits the proto's uint64 fields and
the signed 64-bit integers of the session store and journals."""
MAX_SESSION_ID = 128
"""Longest session id, in characters (a UUID has 36)."""
MAX_WORLD_SIZE = 2**20
MAX_PID = 2**31 - 1
"""The largest `pid_t`; 0 means not stated."""
MAX_HOST_BYTES = 255
"""A DNS name has at most 253 characters."""
MAX_LABEL_BYTES = 64
"""Longest `ClientIdentity.framework` and `.version`."""


def column_problem(columns: pb.ScalarColumns) -> str | None:
    """What is wrong with the columns' shape (answered INVALID_ARGUMENT before anything is written)."""
    if columns.fixed_step and columns.step:
        return "scalars has both step and fixed_step; send the steps in one of them"
    count = len(column_steps(columns))
    if not len(columns.tag_index) == len(columns.wall_time) == len(columns.value) == count:
        return (
            f"scalars has columns of different lengths (tag_index {len(columns.tag_index)}, step {count}, "
            f"wall_time {len(columns.wall_time)}, value {len(columns.value)}); send one entry per scalar in each"
        )
    return None


def _text(field: str, value: str, max_bytes: int) -> str | None:
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        return f"{field} is {size} bytes, over the limit of {max_bytes}; send a shorter one"
    if not value.isprintable():
        return f"{field} contains a control or format character; send printable characters only"
    return None


def _integer(field: str, value: int, top: int, what: str) -> str | None:
    if not 0 <= value <= top:
        return f"{field} is {value}; it must be 0..{top} ({what})"
    return None


def session_id_problem(session_id: str) -> str | None:
    """Why `session_id` is not one the daemon takes: 1..`MAX_SESSION_ID` printable characters, none of them a
    path separator nor `..`, and not `.` (a bucket logdir names an object by it: `.summaryd/sessions/<id>`)."""
    if not session_id or len(session_id) > MAX_SESSION_ID or not session_id.isprintable():
        return f"session_id must be 1..{MAX_SESSION_ID} printable characters (a UUID)"
    if "/" in session_id or "\\" in session_id or ".." in session_id or session_id == ".":
        return "session_id may not contain '/', '\\' or '..', nor be '.'; send a UUID"
    return None


def open_problem(request: pb.OpenSessionRequest) -> str | None:
    """What is wrong with an `OpenSession` request's id, numbers and client identity (its run path aside)."""
    client = request.client
    return (
        session_id_problem(request.session_id)
        or _integer("next_sequence", request.next_sequence, MAX_SEQUENCE, "the first sequence number not yet acked")
        or _integer("world_size", request.world_size, MAX_WORLD_SIZE, "the number of workers of the job")
        or _integer("client.pid", client.pid, MAX_PID, "the client's process id, 0 when unknown")
        or _text("client.host", client.host, MAX_HOST_BYTES)
        or _text("client.framework", client.framework, MAX_LABEL_BYTES)
        or _text("client.version", client.version, MAX_LABEL_BYTES)
    )


def write_problem(request: pb.WriteRequest) -> str | None:
    """What is wrong with a batch's numbering (its events must be numbered within 1..`MAX_SEQUENCE`) or its
    shape (serialized events or scalar columns, never both; columns of one length)."""
    return counted_write_problem(request)[0]


def counted_write_problem(request: pb.WriteRequest) -> tuple[str | None, int]:
    """`write_problem`, and how many events the batch carries (read on the way: each read of a field costs a
    lookup)."""
    if request.HasField("scalars"):
        if request.events:
            return "a batch carries events or scalars, not both; send them as two batches in sequence order", 0
        columns = request.scalars
        problem = column_problem(columns)
        if problem is not None:
            return problem, 0
        count = len(column_steps(columns))  # no events
    else:
        count = len(request.events)  # no columns, so no steps
    first = request.first_sequence
    if count and first < 1:
        return "first_sequence starts at 1", count
    if first > MAX_SEQUENCE or (count and first + count - 1 > MAX_SEQUENCE):
        return (
            f"a batch of {count} events from first_sequence {first} reaches beyond {MAX_SEQUENCE}, the highest "
            "sequence number; open a new session"
        ), count
    return None, count
