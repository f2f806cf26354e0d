"""Limits on what a client controls; each is an option of `summaryd serve` (flag `--max-...`, `Config.limits`)
and the message of a refusal names it, so that an operator knows which flag to raise."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from summaryd.server.errors import LimitError
from summaryd.server.settings import flag, option
from summaryd.v1.runpath import MAX_DEPTH, MAX_RUN_PATH_BYTES

__all__ = ["LimitError", "Limits", "flag"]

# How far beyond --max-message-bytes a message still reaches the service (which refuses it naming the flag).
MESSAGE_SLACK_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """The limits in force, each a positive number (else ValueError naming its flag)."""

    max_message_bytes: int = option(
        64 * 1024 * 1024,
        f"largest gRPC message (one batch of events) a client may send; gRPC itself drops any message more than "
        f"{MESSAGE_SLACK_BYTES // 2**20} MiB larger",
        "BYTES",
    )
    max_batch_events: int = option(10_000, "most events one write batch may carry", "N")
    max_event_bytes: int = option(16 * 1024 * 1024, "largest serialized event a client may send", "BYTES")
    max_tag_bytes: int = option(1024, "longest summary tag (UTF-8 bytes) an event may carry", "BYTES")
    max_run_path_bytes: int = option(MAX_RUN_PATH_BYTES, "longest run path (UTF-8 bytes) a client may name", "BYTES")
    max_run_depth: int = option(MAX_DEPTH, "most directories a run path may have", "N")
    max_sessions: int = option(4096, "most live sessions, over all clients", "N")
    max_sessions_per_peer: int = option(1024, "most live sessions opened from one client address (host)", "N")
    # As many as sessions: every rank of a job writes a run of its own (`<run>/<worker>`), so a run per session,
    # and its aggregate runs beside. 1,024 refused the last ranks of a 1,024-rank job.
    max_open_runs: int = option(4096, "most runs with an open event file at once", "N")
    stream_idle_timeout: float = option(
        120.0,
        "seconds a write stream may send nothing before it is ended (clients send heartbeats at a third of the "
        "lease at most); must exceed a third of --session-lease",
        "SECS",
    )

    def __post_init__(self) -> None:
        # A --max-event-bytes above --max-message-bytes is allowed and moot: the message limit refuses first.
        for limit in dataclasses.fields(self):
            if getattr(self, limit.name) <= 0:
                raise ValueError(f"{flag(limit.name)} must be positive")


DEFAULT = Limits()
