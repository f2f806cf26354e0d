"""The process's limit of open files, raised to what `--max-open-runs` needs where the hard limit allows."""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("summaryd.server.open_files")  # the name log lines carry, kept across moves

FILES_PER_RUN = 3
"""An open run holds its directory, its event file and its journal open."""
SPARE_FILES = 256
"""For connections, the session store, the lock, logs and the executor's own."""


def ensure_open_files(max_open_runs: int) -> int:
    """Raise the soft limit of open files towards what `max_open_runs` runs need (as far as the hard limit
    allows; many systems start processes at 1,024, which a few hundred runs exhaust). Returns the soft limit
    in force; warns when it stays below the need."""
    needed = max_open_runs * FILES_PER_RUN + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the limit of open files from %d to %d: %s", soft, target, exc)
        else:
            log.info("raised the limit of open files from %d to %d", soft, target)
            soft = target
    if soft < needed:
        log.warning(
            "the limit of open files is %d; --max-open-runs %d needs about %d: lower --max-open-runs or raise the "
            "hard limit (ulimit -Hn, or the container's nofile ulimit)",
            soft,
            max_open_runs,
            needed,
        )
    return soft
