"""Files beside a run's event files (`PutFile`): the projector's `projector_config.pbtxt` and its data files.

A client names a file relative to its session's run directory. The path follows the run-path rules
(`runpath.validate_run`: relative, normalised, printable) and is at most `MAX_FILE_DEPTH` components deep; no
component may contain `tfevents` (the daemon's event files are its own) or start with `.summaryd` (the
daemon's temporary files). The directories are opened one component at a time with `O_NOFOLLOW` below the
logdir, and the file is written whole to a temporary file, fsynced and renamed over the old one, so a reader
never sees half a file and a resend replaces rather than duplicates.
"""

from __future__ import annotations

import os
import secrets

from summaryd.server.errors import RunPathError
from summaryd.server.storage.runpath import open_run_dir, validate_run
from summaryd.v1.atomic import replace_file

MAX_FILE_DEPTH = 4
_TEMP_PREFIX = ".summaryd"


def validate_file_path(path: str) -> list[str]:
    """Check a `PutFile` path; return its components.

    Raises:
        RunPathError: with a message that says what to change.
    """
    if not path:
        raise RunPathError("file path is empty; name the file, e.g. 'projector_config.pbtxt'")
    if path.endswith("/"):
        raise RunPathError(f"file path {path!r} ends with '/'; name a file, not a directory")
    try:
        parts = validate_run(path)
    except RunPathError as exc:
        raise RunPathError(str(exc).replace("run path", "file path")) from None
    if len(parts) > MAX_FILE_DEPTH:
        raise RunPathError(f"file path {path!r} is {len(parts)} components deep, over the limit of {MAX_FILE_DEPTH}")
    for part in parts:
        if "tfevents" in part:
            raise RunPathError(f"file path {path!r}: names containing 'tfevents' are the daemon's event files")
        if part.startswith(_TEMP_PREFIX):
            raise RunPathError(f"file path {path!r}: names starting with {_TEMP_PREFIX!r} are the daemon's own")
    return parts


def put_file(logdir_fd: int, run_parts: list[str], file_parts: list[str], content: bytes) -> None:
    """Write `content` to `<run>/<file path>` below `logdir_fd` (blocking; run it on the executor).

    Raises:
        RunPathError: a directory on the way is a symlink or a file.
        OSError: the write failed (a full disk, the name is a directory, ...).
    """
    *dirs, name = file_parts
    dir_fd = open_run_dir(logdir_fd, [*run_parts, *dirs])
    try:
        # A name clients cannot use, so that two puts of one file at once each write their own.
        replace_file(name, content, dir_fd=dir_fd, temporary=f"{_TEMP_PREFIX}-put-{secrets.token_hex(8)}")
    finally:
        os.close(dir_fd)
