"""Replacing a file whole: no reader and no crash ever sees it half written.

The one write-sync-rename of both sides: the client's spool manifests and kept files, the daemon's `PutFile`
files, and the compaction of its journals and session store.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable

__all__ = ["replace_file"]

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def replace_file(
    name: str | os.PathLike[str],
    content: bytes,
    *,
    dir_fd: int | None = None,
    temporary: str | None = None,
    before_replace: Callable[[str], object] | None = None,
) -> None:
    """Make `name` hold exactly `content`: written to a new file beside it, synced, renamed over it, and the
    directory synced. A crash at any point leaves the old file or the new one, never a mix; on an error the
    temporary file is removed and the old file stands.

    Args:
        name: the file; relative to `dir_fd` when that is given (then one component, no directories).
        dir_fd: a directory descriptor `name` is relative to (it is never followed through a symlink).
        temporary: the temporary file's name (one component, created exclusively, so it must not exist): for
            callers whose recovery knows it. Default: a fresh random name ending in `.tmp` beside `name`.
        before_replace: called with the temporary file's path (as `os` functions take it with `dir_fd`), synced
            and whole, just before the rename: to open it, or to keep the old file aside first. What it raises
            aborts the replacement.

    Raises:
        OSError: the write, sync or rename failed (the old file stands).
    """
    path = os.fspath(name)
    directory, base = os.path.split(path)
    temporary = os.path.join(directory, temporary or f".{base}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, 0o644, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if before_replace is not None:
            before_replace(temporary)
        # rename replaces a file or a symlink by that name (it never follows one); a directory refuses it.
        os.rename(temporary, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise
    _sync_directory(directory, dir_fd)


def _sync_directory(directory: str, dir_fd: int | None) -> None:
    """Make the rename itself durable: sync the directory that holds the name."""
    if dir_fd is not None and not directory:
        os.fsync(dir_fd)
        return
    fd = os.open(directory or ".", _DIRECTORY, dir_fd=dir_fd)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
