"""Run paths: what a client may name, and opening that directory without ever leaving the logdir.

What a client may name follows `summaryd.v1.runpath`'s rules, which the client checks too. The directories are
walked one component at a time with `O_NOFOLLOW` relative to the parent's descriptor, so a symlink anywhere on the
way (even one created after the path was checked) is refused instead of followed; and every directory on the way
is compared with the daemon's state directory (by device and inode, wherever `--state-dir` put it), which no run
may enter.
"""

from __future__ import annotations

import contextlib
import errno
import os

from summaryd.server.errors import RunPathError
from summaryd.v1.runpath import MAX_DEPTH, MAX_RUN_PATH_BYTES, run_dir_parts, validate_run, validate_worker

__all__ = [
    "MAX_DEPTH",
    "MAX_RUN_PATH_BYTES",
    "allow",
    "check_run_dir",
    "dir_identity",
    "forbid",
    "open_existing_dir",
    "open_run_dir",
    "run_dir_parts",
    "validate_run",
    "validate_worker",
]

DirIdentity = tuple[int, int]
"""A directory's (st_dev, st_ino)."""

# The state directories of the daemons in this process (one, but tests run several): no run may walk into one.
_state_dirs: set[DirIdentity] = set()


def dir_identity(fd: int) -> DirIdentity:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def forbid(identity: DirIdentity) -> None:
    """Refuse every run path that walks into the directory `identity` (the state directory), until `allow`."""
    _state_dirs.add(identity)


def allow(identity: DirIdentity) -> None:
    _state_dirs.discard(identity)


def _refuse_state_dir(fd: int, parts: list[str], depth: int) -> None:
    if _state_dirs and dir_identity(fd) in _state_dirs:
        where = "/".join(parts[: depth + 1])
        raise RunPathError(
            f"{where!r} in the logdir is the daemon's state directory; no run may be in it, name the run otherwise"
        )


def open_run_dir(logdir_fd: int, parts: list[str]) -> int:
    """Open (creating as needed) the directory `parts` below `logdir_fd`; return its descriptor.

    Raises:
        RunPathError: when a component exists but is a symlink or not a directory, or is the state directory.
    """
    fd = _walk(logdir_fd, parts, create=True)
    assert fd is not None  # absent components were created
    return fd


def open_existing_dir(logdir_fd: int, parts: list[str]) -> int | None:
    """Open the directory `parts` below `logdir_fd` without creating or following anything; None when it is
    absent, a symlink or not a directory.

    Raises:
        RunPathError: a component is the state directory.
    """
    return _walk(logdir_fd, parts, create=False)


def check_run_dir(logdir_fd: int, parts: list[str]) -> None:
    """Refuse at once a run path that its first write would fail on (the directory is made then); create nothing.

    Raises:
        RunPathError: a part of the path exists as a symlink or a file, or is the state directory.
        OSError: the deepest part that exists cannot be written (EROFS, EACCES).
    """
    fd = os.dup(logdir_fd)
    try:
        for depth, part in enumerate(parts):
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                break  # the rest is made at the first write
            except OSError as exc:
                _refuse_not_a_directory(exc, parts, depth)
                raise
            os.close(fd)
            fd = child
            _refuse_state_dir(fd, parts, depth)
        # Where the first write creates its directory or file: tell the client now if it cannot.
        if os.fstatvfs(fd).f_flag & os.ST_RDONLY:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        if not os.access(".", os.W_OK | os.X_OK, dir_fd=fd):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
    finally:
        os.close(fd)


def _refuse_not_a_directory(exc: OSError, parts: list[str], depth: int) -> None:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        where = "/".join(parts[: depth + 1])
        raise RunPathError(
            f"{where!r} in the logdir is a symlink or a file; summaryd writes only into real directories inside "
            "its logdir"
        ) from None


def _walk(logdir_fd: int, parts: list[str], *, create: bool) -> int | None:
    fd = os.dup(logdir_fd)
    try:
        for depth, part in enumerate(parts):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, mode=0o755, dir_fd=fd)
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if not create and exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                    os.close(fd)
                    return None
                _refuse_not_a_directory(exc, parts, depth)
                raise
            os.close(fd)
            fd = child
            _refuse_state_dir(fd, parts, depth)
        return fd
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
