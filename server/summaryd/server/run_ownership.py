"""Which runs of a bucket logdir this daemon writes: their leases, taken as sessions open and kept while held.

A run's lease is for the run its clients name, all its workers (`leased_run`): a job's workers, and the
aggregates of them, are written by one daemon. A session opening on a run this daemon does not write yet takes
the run's lease first (`leases.RunLeases`); another daemon's live lease refuses it with `RunOwnedElsewhereError`,
naming where the client belongs, when that address is a daemon's: one of `--peers` (with them), or at least a
HOST:PORT (without); a lease naming any other address (a document written by someone who can write the bucket
but is no daemon of it) refuses the session as `OwnerUnknownError`, naming nothing. Every session holding the
run counts; when the last one leaves (its file closed) and what every session of the run staged is uploaded,
the lease is released so that another daemon need not wait for it to expire. While held, leases are renewed
in the background at a third of their duration. A lease found taken over at renewal (another daemon judged
this one gone) is dropped, logged, and reported to `on_lost`, which ends the run's live sessions here: their
clients open them again and are sent to the new owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import uuid
from collections.abc import Awaitable, Callable

from summaryd.server.bucket import BucketError
from summaryd.server.errors import OwnerUnknownError, RunOwnedElsewhereError
from summaryd.server.leases import Lease, LeaseHeldError, LeaseLostError, RunLeases
from summaryd.server.logs import Throttle

log = logging.getLogger(__name__)
_unknown_owners = Throttle(log)

HOLDER_FILE = "daemon-id"


def holder_id(state_path: str) -> str:
    """The daemon's lease-holder id, kept in its state directory: a daemon restarted on the same state (and
    staged files) gets back the leases it held; one started on a fresh disk is another holder.

    Blocking: reads or writes a small file.
    """
    path = os.path.join(state_path, HOLDER_FILE)
    try:
        with open(path) as f:
            found = f.read().strip()
        if found:
            return found
    except FileNotFoundError:
        pass
    holder = uuid.uuid4().hex
    with open(path + ".tmp", "w") as f:
        f.write(holder + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    return holder


def leased_run(run_dir: str, worker: str) -> str:
    """The run whose lease a session of `run_dir` holds: the run its client named (`run_dir` without the
    session's worker label), so that all the workers of a job land on one daemon."""
    return run_dir[: -len(worker) - 1] if worker and run_dir.endswith("/" + worker) else run_dir


def daemon_address_key(address: str) -> str | None:
    """`address` as compared when it is a HOST:PORT a daemon could advertise (the host without case, an IP
    address in its canonical form; nothing resolved), else None."""
    host, sep, port = address.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        return None
    if any(char.isspace() or char in "/?#@[]" for char in host):
        return None
    try:
        host = ipaddress.ip_address(host).compressed
    except ValueError:
        host = host.lower()
    return f"[{host}]:{int(port)}" if ":" in host else f"{host}:{int(port)}"


class RunOwnership:
    """The leases of the runs this daemon writes, counted by the sessions that hold each run; other daemons'
    clients are sent to `peers` only (any HOST:PORT when None)."""

    def __init__(self, leases: RunLeases, peers: tuple[str, ...] | None = None) -> None:
        self.leases = leases
        keys = () if peers is None else (daemon_address_key(a) for a in (*peers, leases.address))
        self._peers = None if peers is None else frozenset(key for key in keys if key is not None)
        # Told (outside the lease lock) of each run whose lease was taken over; set by the session lifecycle.
        self.on_lost: Callable[[str], Awaitable[None]] | None = None
        self._held: dict[str, tuple[Lease, int]] = {}
        # Lease writes of one daemon are few (one per run opened or closed) and must not interleave: a renewal
        # racing an acquire of the same run would leave the daemon with a stale ETag.
        self._lock = asyncio.Lock()
        self._renewer: asyncio.Task[None] | None = None
        self._releasing: set[asyncio.Task[None]] = set()
        # Per run, the uploads its sessions that left are waiting for: the lease goes after all of them.
        self._settling: dict[str, list[asyncio.Task[None]]] = {}

    @property
    def address(self) -> str:
        return self.leases.address

    def held(self) -> dict[str, Lease]:
        """The lease of each run this daemon holds."""
        return {run: lease for run, (lease, _) in self._held.items()}

    def holds(self, run_dir: str) -> bool:
        """Whether this daemon holds the lease that covers `run_dir` (a run, or a worker's directory of one)."""
        parts = run_dir.split("/")
        return any("/".join(parts[:n]) in self._held for n in range(len(parts), 0, -1))

    async def take(self, run_dir: str) -> None:
        """Count one more session on `run_dir`, taking its lease when this daemon does not hold it yet.

        Raises:
            RunOwnedElsewhereError: another daemon holds a live lease on the run.
            OSError: the bucket could not be read or written (EIO: the client tries again).
        """
        async with self._lock:
            held = self._held.get(run_dir)
            if held is not None:
                self._held[run_dir] = (held[0], held[1] + 1)
                return
            try:
                lease = await self.leases.acquire(run_dir)
            except LeaseHeldError as exc:
                raise self._refusal(exc) from None
            except (BucketError, LeaseLostError) as exc:
                raise OSError(errno.EIO, f"the run's lease could not be taken: {exc}") from exc
            self._held[run_dir] = (lease, 1)
            log.info("run %s: lease taken (until %.0f)", run_dir, lease.expires)

    def _refusal(self, held: LeaseHeldError) -> Exception:
        """Send the client to the lease's daemon, unless its address is none a daemon of this prefix has."""
        key = daemon_address_key(held.address)
        if key is not None and (self._peers is None or key in self._peers):
            return RunOwnedElsewhereError(held.run_dir, held.address)
        why = "not a HOST:PORT" if key is None else "not one of --peers"
        _unknown_owners.warning(
            "unknown owner",
            "run %s: its live lease (holder %r) names the address %r, %s: its clients are not sent there (a lease "
            "written by something that is no daemon of this prefix, or a daemon missing from --peers)",
            held.run_dir,
            held.holder[:64],
            held.address[:200],
            why,
        )
        return OwnerUnknownError(held.run_dir)

    async def let_go(self, run_dir: str, settled: Callable[[], Awaitable[None]] | None = None) -> None:
        """Count one session fewer on `run_dir`, whose staged bytes are uploaded once `settled()` returns. The
        last one releases the lease once every leaving session's upload is done (the next owner's segments must
        come after them). Until then the lease is kept and renewed, and a session opening on the run here takes
        it up again."""
        async with self._lock:
            held = self._held.get(run_dir)
            if held is None:
                return
            lease, count = held
            settling = [task for task in self._settling.pop(run_dir, []) if not task.done()]
            if settled is not None:
                settling.append(self._background(self._settle(run_dir, settled)))
            if count > 1 or settling:
                self._held[run_dir] = (lease, count - 1)
                self._settling[run_dir] = settling  # kept until the release: a later leaver waits for them too
                if count == 1:
                    self._background(self._release_when(run_dir))
                return
            del self._held[run_dir]
            await self._release(lease)

    def _background(self, work: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)
        return task

    @staticmethod
    async def _settle(run_dir: str, settled: Callable[[], Awaitable[None]]) -> None:
        try:
            await settled()
        except Exception:
            log.exception("run %s: waiting for a session's last upload failed; its lease goes without it", run_dir)

    def _unsettled(self, run_dir: str) -> list[asyncio.Task[None]]:
        return [task for task in self._settling.get(run_dir, []) if not task.done()]

    async def _release_when(self, run_dir: str) -> None:
        while pending := self._unsettled(run_dir):
            await asyncio.gather(*pending)
        async with self._lock:
            held = self._held.get(run_dir)
            # Lost meanwhile, taken up again, or left again with uploads of its own (their release follows them).
            if held is None or held[1] > 0 or self._unsettled(run_dir):
                return
            self._settling.pop(run_dir, None)
            del self._held[run_dir]
            await self._release(held[0])

    def start(self) -> None:
        """Renew held leases in the background, at a third of their duration."""
        self._renewer = asyncio.create_task(self._renew_forever())

    async def close(self) -> None:
        """Stop renewing and release every lease still held (shutdown, after the last upload)."""
        for task in [*self._releasing, *([self._renewer] if self._renewer else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        async with self._lock:
            held, self._held, self._settling = list(self._held.values()), {}, {}
            for lease, _ in held:
                await self._release(lease)

    async def _release(self, lease: Lease) -> None:
        try:
            await self.leases.release(lease)
        except BucketError as exc:  # it expires on its own
            log.warning("run %s: the lease could not be released: %s", lease.run_dir, exc)
        else:
            log.info("run %s: lease released", lease.run_dir)

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.leases.duration / 3)
            async with self._lock:
                lost = [run for run, (lease, count) in list(self._held.items()) if not await self._renew(lease, count)]
            for run_dir in lost:
                if self.on_lost is not None:
                    try:
                        await self.on_lost(run_dir)
                    except Exception:
                        log.exception("run %s: ending its sessions after the lease was lost failed", run_dir)

    async def _renew(self, lease: Lease, count: int) -> bool:
        """Renew one lease; False when it was taken over (then it is no longer held)."""
        run_dir = lease.run_dir
        try:
            self._held[run_dir] = (await self.leases.renew(lease), count)
        except LeaseLostError:
            del self._held[run_dir]
            log.error("run %s: its lease was taken over by another daemon; its sessions here are released", run_dir)
            return False
        except BucketError as exc:  # tried again at the next round, while the lease lasts
            log.warning("run %s: the lease could not be renewed: %s", run_dir, exc)
        return True
