"""Run paths: what a client may name, and opening that directory without ever leaving the logdir.

What a client may name follows `summaryd.v1.runpath`'s rules, which the client checks too. The directories are
walked one component at a time with `O_NOFOLLOW` relative to the parent's descriptor, so a symlink anywhere on the
way (even one created after the path was checked) is refused instead of followed.
"""

from __future__ import annotations

import contextlib
import errno
import os

from summaryd.server.errors import RunPathError
from summaryd.v1.runpath import MAX_DEPTH, MAX_RUN_PATH_BYTES, run_dir_parts, validate_run, validate_worker

__all__ = ["MAX_DEPTH", "MAX_RUN_PATH_BYTES", "open_run_dir", "run_dir_parts", "validate_run", "validate_worker"]


def open_run_dir(logdir_fd: int, parts: list[str]) -> int:
    """Open (creating as needed) the directory `parts` below `logdir_fd`; return its descriptor.

    Raises:
        RunPathError: when a component exists but is a symlink or not a directory.
    """
    fd = os.dup(logdir_fd)
    try:
        for depth, part in enumerate(parts):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, mode=0o755, dir_fd=fd)
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = "/".join(parts[: depth + 1])
                    raise RunPathError(
                        f"{where!r} in the logdir is a symlink or a file; summaryd writes only into real "
                        "directories inside its logdir"
                    ) from None
                raise
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise
