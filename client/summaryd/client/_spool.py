"""The client's spool: events the daemon has not acknowledged, kept on local disk while it is away.

One directory per session, itself a valid TensorBoard logdir (`tensorboard --logdir <it>` shows the run):

    <spool root>/<session id>/
        manifest.json             session id, run, worker, the daemons' addresses (`addresses`, all the writer
                                  was given; `address`, the first, is what older manifests have) and the
                                  redirect allow-list, and `first_sequence`: the sequence number of the event
                                  file's first event (they follow without gaps)
        lock                      held (flock) by the process that owns the session, and by `summaryd replay`
        <run>[/<worker>]/events.out.tfevents.<secs>.<host>.<pid>.spool
                                  `file_version`, then the events in sequence order, as TFRecords

The sender appends whole batches and never rewrites; what a crash tears off the end is not there for replay
either (it was never on disk whole). `summaryd replay` records what it delivered in `manifest.json`
(`delivered_through`); the daemon's own session store is what makes a second replay write nothing twice.
The spool root is `SUMMARYD_SPOOL_DIR`, else `$XDG_CACHE_HOME/summaryd/spool` (`~/.cache/summaryd/spool`).

Files beside the event files (the embedding projector's) that the daemon did not take go to a sibling,
`<spool root>/<session id>.files/`: a manifest of format `summaryd-files/1` (the same identity) and the files
under `files/`, each by its path in the run directory; `summaryd replay` uploads them with the session's events.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorboard.compat.proto.event_pb2 import Event

from summaryd.client._environment import parse_address
from summaryd.v1.atomic import replace_file
from summaryd.v1.wire import frame, whole_records

MANIFEST = "manifest.json"
LOCK = "lock"
FORMAT = "summaryd-spool/1"
FILES_FORMAT = "summaryd-files/1"
FILES_SUFFIX = ".files"
FILES_DIR = "files"


def default_root(environ: Mapping[str, str] = os.environ) -> Path:
    """`SUMMARYD_SPOOL_DIR`, else the user's cache directory."""
    if environ.get("SUMMARYD_SPOOL_DIR"):
        return Path(environ["SUMMARYD_SPOOL_DIR"])
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "summaryd" / "spool"


@dataclass(frozen=True)
class SpoolIdentity:
    """Whose events a spool holds and where they were going."""

    session_id: str
    run: str
    worker: str
    world_size: int
    address: str
    framework: str
    session_started: float = 0.0
    """When the session id was created (Unix seconds); see `OpenSessionRequest.session_started`."""
    aggregate: bool | tuple[str, ...] = True
    """Cross-worker aggregation: on, off, or the tag patterns aggregated (not kept in a spool's manifest: a
    replayed session is aggregated as the daemon's default has it)."""
    addresses: tuple[str, ...] = ()
    """Every daemon the writer was given, `address` first (empty: `address` alone)."""
    redirect_allow: tuple[str, ...] = ()
    """The daemons beyond `addresses` a redirect may lead to."""

    def manifest(self, format: str) -> dict[str, Any]:
        """The manifest of a spool of this session, written by this process now."""
        return {
            "format": format,
            "session_id": self.session_id,
            "run": self.run,
            "worker": self.worker,
            "world_size": self.world_size,
            "address": self.address,
            "addresses": list(self.addresses or (self.address,)),
            "redirect_allow": list(self.redirect_allow),
            "framework": self.framework,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "created": time.time(),
            "session_started": self.session_started,
        }


def outbox_root(spool_root: Path, pid: int) -> Path:
    """Where the children of process `pid` put their outboxes."""
    return spool_root / f"children-of-{pid}"


def recorded_daemons(manifest: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The daemons a spool's manifest names and the redirect allow-list it records (a manifest written before
    both were recorded names one daemon, `address`, and no allow-list).

    Raises:
        ValueError: an address recorded is not a daemon address.
    """
    addresses = manifest.get("addresses") or [manifest["address"]]
    allow = manifest.get("redirect_allow") or []
    return tuple(dict.fromkeys(parse_address(str(a)) for a in addresses)), tuple(parse_address(str(a)) for a in allow)


class SpoolLockedError(RuntimeError):
    """Another process (the one still logging, or another replay) holds the spool."""


def lock(directory: Path) -> int:
    """Take the spool's lock without waiting; return its descriptor (closing it releases the lock)."""
    fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise SpoolLockedError(f"{directory} is in use by process {holder} (still logging, or replaying)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Replace the manifest whole (`replace_file`: written beside it, synced, renamed)."""
    replace_file(directory / MANIFEST, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())


def files_spool_of(spool: Path) -> Path:
    """Where the files of the session whose events are spooled at `spool` are kept."""
    return spool.with_name(spool.name + FILES_SUFFIX)


def spool_files(root: Path, identity: SpoolIdentity, files: Sequence[tuple[str, bytes]]) -> Path:
    """Keep files for `summaryd replay` in the session's files spool (made if need be); a path kept before is
    replaced, as the daemon replaces it. Each file is written whole: a temporary file, synced, renamed."""
    directory = root / (identity.session_id + FILES_SUFFIX)
    (directory / FILES_DIR).mkdir(parents=True, exist_ok=True)
    lock_fd = lock(directory)
    try:
        for path, content in files:
            parts = Path(path).parts
            if not parts or Path(path).is_absolute() or ".." in parts:
                raise ValueError(f"file path {path!r} is not a relative path inside the run")
            target = directory.joinpath(FILES_DIR, *parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            replace_file(target, content)
        write_manifest(directory, identity.manifest(FILES_FORMAT))
    finally:
        os.close(lock_fd)
    return directory


def spooled_files(directory: Path) -> list[tuple[str, bytes]]:
    """The files of a files spool, by their paths in the run directory, sorted."""
    base = directory / FILES_DIR
    return [
        (path.relative_to(base).as_posix(), path.read_bytes())
        for path in sorted(base.rglob("*"))
        if path.is_file() and not path.name.endswith(".tmp")
    ]


class Spool:
    """The spool of one session, open for appending by the sender thread that owns it."""

    def __init__(self, root: Path, identity: SpoolIdentity, first_sequence: int) -> None:
        self.directory = root / identity.session_id
        self.first_sequence = first_sequence
        run_dir = Path(identity.run) / identity.worker if identity.worker else Path(identity.run)
        host = socket.gethostname().replace("/", "_") or "localhost"
        self.file = run_dir / f"events.out.tfevents.{int(time.time()):010d}.{host}.{os.getpid()}.spool"
        (self.directory / run_dir).mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock(self.directory)
        try:
            path = self.directory / self.file
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o644)
            self.size = 0
            header = Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString()
            self._append(frame(header))
            manifest = identity.manifest(FORMAT)
            manifest.update(file=self.file.as_posix(), first_sequence=first_sequence)
            write_manifest(self.directory, manifest)
        except BaseException:
            self.discard()
            raise

    def _append(self, blob: bytes) -> None:
        written = 0
        try:
            while written < len(blob):
                written += os.write(self._fd, blob[written:])
        except OSError:
            if written:
                os.ftruncate(self._fd, self.size)
            raise
        self.size += written

    def append(self, events: Sequence[bytes]) -> tuple[int, int]:
        """Append one batch whole (or nothing, and raise); return the byte span it occupies."""
        start = self.size
        self._append(b"".join(frame(e) for e in events))
        return start, self.size

    def read(self, span: tuple[int, int]) -> list[bytes]:
        """The events of a batch appended earlier."""
        start, end = span
        with open(self.directory / self.file, "rb") as f:
            f.seek(start)
            return list(whole_records(f.read(end - start)))

    def keep(self) -> None:
        """The process is ending with events still spooled: make them durable and let `summaryd replay` in."""
        with contextlib.suppress(OSError):
            os.fsync(self._fd)
        self._close_fds()

    def discard(self) -> None:
        """Everything spooled was acknowledged: delete the spool (the manifest first, so a half-deleted spool
        is never replayed)."""
        with contextlib.suppress(OSError):
            os.unlink(self.directory / MANIFEST)
        self._close_fds()
        shutil.rmtree(self.directory, ignore_errors=True)

    def forget(self) -> None:
        """In a forked child: close the inherited descriptors, touch nothing on disk (the parent owns it)."""
        self._close_fds()

    def _close_fds(self) -> None:
        for name in ("_fd", "_lock_fd"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, -1)
