"""The rules a run path and a worker label must follow, shared by the daemon (which enforces them) and the client
(which checks them when a writer is made, so that a path the daemon would refuse fails at once, not every event).

A run path is relative to the daemon's logdir, `/`-separated, normalised (no empty, `.` or `..` parts), in NFC,
free of control characters and backslashes, bounded in length and depth, and does not start with the name of the
daemon's default state directory.
"""

from __future__ import annotations

import unicodedata

MAX_RUN_PATH_BYTES = 1024
MAX_COMPONENT_BYTES = 255
MAX_DEPTH = 16
MAX_WORKER_BYTES = 128
RESERVED_RUN = ".summaryd"
"""The first component of a run path that names the daemon's default state directory; clients may not use it."""


class RunPathError(ValueError):
    """A run path or worker label that would leave the logdir or is not a plain relative path."""


def _check_component(part: str, what: str) -> None:
    if part in ("", ".", ".."):
        raise RunPathError(f"{what} has an empty, '.' or '..' component; give a plain relative path like 'exp/lr-0.1'")
    if len(part.encode()) > MAX_COMPONENT_BYTES:
        raise RunPathError(f"{what} has a component longer than {MAX_COMPONENT_BYTES} bytes")
    for char in part:
        if char == "\\" or unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            raise RunPathError(
                f"{what} contains the character U+{ord(char):04X}; use printable characters without backslashes"
            )


def validate_run(run: str, max_bytes: int | None = MAX_RUN_PATH_BYTES, max_depth: int | None = MAX_DEPTH) -> list[str]:
    """Check a run path (at most `max_bytes` long and `max_depth` directories deep; None: unbounded, for a
    client that does not know the daemon's limits); return its parts.

    Raises:
        RunPathError: with a message that says what to change.
    """
    if not run:
        raise RunPathError("run path is empty; name the run, e.g. 'exp1'")
    size = len(run.encode(errors="surrogatepass"))
    if max_bytes is not None and size > max_bytes:
        raise RunPathError(
            f"run path is {size} bytes, over the limit of {max_bytes} bytes (--max-run-path-bytes); name a shorter run"
        )
    if run.startswith("/"):
        raise RunPathError(f"run path {run!r} is absolute; give a path relative to the daemon's logdir")
    if unicodedata.normalize("NFC", run) != run:
        raise RunPathError(f"run path {run!r} is not in Unicode normal form NFC")
    parts = run.rstrip("/").split("/")
    if max_depth is not None and len(parts) > max_depth:
        raise RunPathError(
            f"run path {run!r} is deeper than {max_depth} directories ({len(parts)}), the limit (--max-run-depth)"
        )
    for part in parts:
        _check_component(part, f"run path {run!r}")
    return parts


def validate_worker(worker: str) -> None:
    """Check a worker label: one path component, such as `rank-3` or `worker-0`."""
    if len(worker.encode(errors="surrogatepass")) > MAX_WORKER_BYTES:
        raise RunPathError(f"worker label is longer than {MAX_WORKER_BYTES} bytes")
    if "/" in worker:
        raise RunPathError(f"worker label {worker!r} contains '/'; use a single name like 'rank-3'")
    _check_component(worker, f"worker label {worker!r}")


def run_dir_parts(
    run: str, worker: str = "", max_bytes: int | None = MAX_RUN_PATH_BYTES, max_depth: int | None = MAX_DEPTH
) -> list[str]:
    """The directory parts of a session's run directory, `<run>/<worker>`, checked as the daemon checks them.

    Raises:
        RunPathError: with a message that says what to change.
    """
    parts = validate_run(run, max_bytes, max_depth)
    if worker:
        validate_worker(worker)
        parts = [*parts, worker]
    if parts[0] == RESERVED_RUN:
        raise RunPathError(
            f"run path {run!r}: {RESERVED_RUN!r} is where the daemon keeps its state; name the run otherwise"
        )
    return parts
