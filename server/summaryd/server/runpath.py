"""Run paths: what a client may name, and opening that directory without ever leaving the logdir.

A run path is relative to the logdir, `/`-separated, normalised (no empty, `.` or `..` parts), free of control
characters and backslashes, and bounded in length and depth. The directories are walked one component at a
time with `O_NOFOLLOW` relative to the parent's descriptor, so a symlink anywhere on the way (even one created
after the path was checked) is refused instead of followed; and every directory on the way is compared with
the daemon's state directory (by device and inode, wherever `--state-dir` put it), which no run may enter.
"""

from __future__ import annotations

import contextlib
import errno
import os
import unicodedata

from summaryd.server.errors import RunPathError

MAX_RUN_PATH_BYTES = 1024
MAX_COMPONENT_BYTES = 255
MAX_DEPTH = 16
MAX_WORKER_BYTES = 128

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


def validate_run(run: str, max_bytes: int = MAX_RUN_PATH_BYTES, max_depth: int = MAX_DEPTH) -> list[str]:
    """Check a client's run path (at most `max_bytes` long and `max_depth` directories deep); return its parts.

    Raises:
        RunPathError: with a message that says what to change.
    """
    if not run:
        raise RunPathError("run path is empty; name the run, e.g. 'exp1'")
    size = len(run.encode())
    if size > max_bytes:
        raise RunPathError(
            f"run path is {size} bytes, over the limit of {max_bytes} bytes (--max-run-path-bytes); name a shorter run"
        )
    if run.startswith("/"):
        raise RunPathError(f"run path {run!r} is absolute; give a path relative to the daemon's logdir")
    if unicodedata.normalize("NFC", run) != run:
        raise RunPathError(f"run path {run!r} is not in Unicode normal form NFC")
    parts = run.rstrip("/").split("/")
    if len(parts) > max_depth:
        raise RunPathError(
            f"run path {run!r} is deeper than {max_depth} directories ({len(parts)}), the limit (--max-run-depth)"
        )
    for part in parts:
        _check_component(part, f"run path {run!r}")
    return parts


def validate_worker(worker: str) -> None:
    """Check a worker label: one path component, such as `rank-3` or `worker-0`."""
    if len(worker.encode()) > MAX_WORKER_BYTES:
        raise RunPathError(f"worker label is longer than {MAX_WORKER_BYTES} bytes")
    if "/" in worker:
        raise RunPathError(f"worker label {worker!r} contains '/'; use a single name like 'rank-3'")
    _check_component(worker, f"worker label {worker!r}")


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
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = "/".join(parts[: depth + 1])
                    raise RunPathError(
                        f"{where!r} in the logdir is a symlink or a file; summaryd writes only into real "
                        "directories inside its logdir"
                    ) from None
                raise
            os.close(fd)
            fd = child
            _refuse_state_dir(fd, parts, depth)
        return fd
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
