"""Limits on what a client controls; each is a `Config` field (flag `--max-...`) and the message of a refusal
names it, so that an operator knows which flag to raise."""

from __future__ import annotations

from dataclasses import dataclass

from summaryd.server.errors import LimitError
from summaryd.v1.runpath import MAX_DEPTH, MAX_RUN_PATH_BYTES

__all__ = ["LimitError", "Limits", "flag"]


def flag(name: str) -> str:
    """The command-line flag of the `Config` field `name`."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class Limits:
    """The limits in force; the defaults here are the defaults of the flags."""

    max_message_bytes: int = 64 * 1024 * 1024
    max_batch_events: int = 10_000
    max_event_bytes: int = 16 * 1024 * 1024
    max_tag_bytes: int = 1024
    max_run_path_bytes: int = MAX_RUN_PATH_BYTES
    max_run_depth: int = MAX_DEPTH
    max_sessions: int = 4096
    max_sessions_per_peer: int = 1024
    max_open_runs: int = 1024
    stream_idle_timeout: float = 120.0


DEFAULT = Limits()
