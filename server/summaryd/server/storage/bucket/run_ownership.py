"""Which runs of a bucket logdir this daemon writes: their leases, taken as sessions open and kept while held.

A run's lease is for the run its clients name, all its workers (`backend.owned_run`): a job's workers, and the
aggregates of them, are written by one daemon. A session opening on a run this daemon does not write yet takes
the run's lease first (`leases.RunLeases`); another daemon's live lease refuses it with `RunOwnedElsewhereError`,
naming where the client belongs, when that address is a daemon's: one of `--peers` (with them), or at least a
HOST:PORT (without); a lease naming any other address (a document written by someone who can write the bucket
but is no daemon of it) refuses the session as `OwnerUnknownError`, naming nothing. Every session holding the
run counts; when the last one leaves (its file closed) and what every session of the run staged is uploaded,
the lease is released so that another daemon need not wait for it to expire. While held, leases are renewed
in the background at a third of their duration. A lease found taken over at renewal (another daemon judged
this one gone) is dropped, logged, and reported by `lost`, whose reader (the session lifecycle) ends the run's
live sessions here: their clients open them again and are sent to the new owner.

It is also the shipper's fence (`segments.Fencing`): a segment goes up only while the run's lease is live by
this daemon's monotonic clock (`leases.Lease.live`) and names the segment's file; a lease taken from another
holder closes that holder's files to it (`segments.fence_file`) before the run is written here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import ipaddress
import logging
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from summaryd.server.errors import OwnerUnknownError, RunOwnedElsewhereError
from summaryd.server.operations.logs import Throttle
from summaryd.server.storage.bucket.leases import Lease, LeaseHeldError, LeaseLostError, RunLeases, margin
from summaryd.server.storage.bucket.segments import fence_file
from summaryd.server.storage.bucket.store import BucketError

log = logging.getLogger("summaryd.server.run_ownership")  # the name log lines carry, kept across moves
_unknown_owners = Throttle(log)

HOLDER_FILE = "daemon-id"
RENEWALS_AT_ONCE = 32
"""Leases renewed side by side: a round of 1,000 runs at 30 ms a write takes about a second, not 30."""


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
        # Each run whose lease was taken over, until `lost` hands it on (outside the lease lock).
        self._lost_runs: asyncio.Queue[str] = asyncio.Queue()
        self._held: dict[str, tuple[Lease, int]] = {}
        # The lease writes of one run must not interleave (a renewal racing an acquire of the run would leave the
        # daemon with a stale ETag); those of different runs go side by side, and a session opening on a run
        # held already waits for none of them.
        self._locks: dict[str, asyncio.Lock] = {}
        self._renewals = asyncio.Semaphore(RENEWALS_AT_ONCE)
        # Renewals of held leases under way: each is recorded even if whoever asked for it is cancelled (a lease
        # written but not recorded would leave a stale ETag, and the next write would find the lease "lost").
        self._writes: set[asyncio.Task[Lease]] = set()
        # The one under way per run: a caller cancelled while it waits gives the run's lock up before the write
        # lands, so whoever takes the lock next waits for it (`_landed`) before it reads the held version.
        self._in_flight: dict[str, asyncio.Task[Lease]] = {}
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

    async def take(self, run_dir: str) -> None:
        """Count one more session on `run_dir`, taking its lease when this daemon does not hold it yet.

        Raises:
            RunOwnedElsewhereError: another daemon holds a live lease on the run.
            OSError: the bucket could not be read or written (EIO: the client tries again).
        """
        if self._count(run_dir):
            return
        async with self._lock_of(run_dir):
            await self._landed(run_dir)
            if self._count(run_dir):
                return
            try:
                lease = await self.leases.acquire(run_dir)
                if lease.unfenced:  # another holder's files: closed to it before anything is written here
                    for directory, name in lease.unfenced:
                        key = await fence_file(self.leases.bucket, directory, name)
                        log.info("run %s: %s closed to the lease's previous holder at %s", run_dir, name, key)
                    lease = await self.leases.renew(dataclasses.replace(lease, unfenced=()))
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

    def _count(self, run_dir: str) -> bool:
        """Count one more session on a run held already (no lease write); False when it is not held."""
        held = self._held.get(run_dir)
        if held is None:
            return False
        self._held[run_dir] = (held[0], held[1] + 1)
        return True

    def _lock_of(self, run_dir: str) -> asyncio.Lock:
        return self._locks.setdefault(run_dir, asyncio.Lock())

    def _covering(self, run_dir: str) -> str | None:
        parts = run_dir.split("/")
        return next((run for n in range(len(parts), 0, -1) if (run := "/".join(parts[:n])) in self._held), None)

    # ---- the shipper's fence ---------------------------------------------------------------------------

    def valid(self, run_dir: str) -> bool:
        """Whether this daemon may write `run_dir` now: it holds the covering lease, live by its own monotonic
        clock (a daemon paused past its lease finds it not live when it wakes, whatever renewal says later)."""
        run = self._covering(run_dir)
        return run is not None and self._held[run][0].live(self.leases.monotonic(), self.leases.duration)

    async def admit(self, run_dir: str, name: str) -> bool:
        """Whether a segment of staged file `name` of `run_dir` may go up now: the lease is live and names the
        file (written so by ETag first, once per file: a takeover then fences it)."""
        run = self._covering(run_dir)
        if run is None or not self.valid(run_dir):
            return False
        if (run_dir, name) in self._held[run][0].files:
            return True
        async with self._lock_of(run):
            await self._landed(run)
            held = self._held.get(run)
            if held is None or not held[0].live(self.leases.monotonic(), self.leases.duration):
                return False
            if (run_dir, name) not in held[0].files:
                try:
                    await self._renew_held(run, held[0].naming(run_dir, name))
                except LeaseLostError:
                    self._lost(run)
                    return False
                except BucketError as exc:
                    log.warning("run %s: the lease could not name %s (retrying): %s", run, name, exc)
                    return False
        return True

    async def _renew_held(self, run_dir: str, lease: Lease) -> Lease:
        """Write `lease` (a held one, renewed) and record it as held, whether or not the caller is cancelled
        meanwhile; `close` waits for it before it releases.

        Raises:
            LeaseLostError, BucketError: from `RunLeases.renew`.
        """

        async def write() -> Lease:
            renewed = await self.leases.renew(lease)
            if run_dir in self._held:  # sessions counted meanwhile keep their count
                self._held[run_dir] = (renewed, self._held[run_dir][1])
            return renewed

        task = asyncio.ensure_future(write())
        self._writes.add(task)
        self._in_flight[run_dir] = task
        task.add_done_callback(self._writes.discard)
        task.add_done_callback(
            lambda done: self._in_flight.pop(run_dir, None) if self._in_flight.get(run_dir) is done else None
        )
        return await asyncio.shield(task)

    async def _landed(self, run_dir: str) -> None:
        """Wait (holding the run's lock) for a lease write of `run_dir` still under way, whatever its outcome
        (its own caller deals with that): the version held is then the one in the bucket."""
        while (task := self._in_flight.get(run_dir)) is not None and not task.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    def holds(self, run_dir: str) -> bool:
        """Whether this daemon holds the lease that covers `run_dir` (a run, or a worker's directory of one)."""
        return self._covering(run_dir) is not None

    def fenced(self, run_dir: str) -> None:
        """An upload of `run_dir` found its key taken by another daemon's fence: the lease is lost."""
        run = self._covering(run_dir)
        if run is not None:
            self._lost(run)

    def _lost(self, run_dir: str) -> None:
        if self._held.pop(run_dir, None) is None:
            return
        log.error("run %s: its lease was taken over by another daemon; its sessions here are released", run_dir)
        self._lost_runs.put_nowait(run_dir)

    async def lost(self) -> AsyncIterator[str]:
        """Each run whose lease was taken over by another daemon, as it is found (never ends)."""
        while True:
            yield await self._lost_runs.get()

    async def reclaim(self, run_dir: str) -> str | None:
        """Take the lease covering the staged directory `run_dir` back for recovery, when no other daemon held
        it since this one (its holder is still this daemon's id); the leased run, or None. The lease is the
        directory's or its parent's (a worker's directory), whichever exists.

        Raises:
            BucketError: the bucket could not be read or written.
        """
        parent = run_dir.rpartition("/")[0]
        for candidate in [run_dir, *([parent] if parent else [])]:
            lease = await self.leases.read(candidate)
            if lease is None:
                continue
            if lease.holder != self.leases.holder:
                log.warning(
                    "run %s: its lease was taken by %s since this daemon stopped", candidate, lease.address or "?"
                )
                return None
            run = candidate
            break
        else:
            # A daemon stages a run only under its lease: none means it was removed, expired past the
            # retention, and with it the record of who held the run since.
            log.warning("run %s: its lease is gone (removed past the retention) since this daemon stopped", run_dir)
            return None
        try:
            await self.take(run)
        except RunOwnedElsewhereError:
            return None
        except OSError as exc:
            raise BucketError(str(exc)) from exc
        return run

    async def unclaim(self, leased: str) -> None:
        """Recovery of `leased` is done: the lease goes unless a session holds it meanwhile."""
        await self.let_go(leased)

    def margin_left(self) -> float | None:
        """Seconds until the first held lease stops being live by this daemon's clock (None: none held)."""
        now, duration = self.leases.monotonic(), self.leases.duration
        return min(
            (lease.renewed + duration - margin(duration) - now for lease, _ in self._held.values()), default=None
        )

    async def let_go(self, run_dir: str, settled: Callable[[], Awaitable[None]] | None = None) -> None:
        """Count one session fewer on `run_dir`, whose staged bytes are uploaded once `settled()` returns. The
        last one releases the lease once every leaving session's upload is done (the next owner's segments must
        come after them). Until then the lease is kept and renewed, and a session opening on the run here takes
        it up again."""
        async with self._lock_of(run_dir):
            await self._landed(run_dir)
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
        async with self._lock_of(run_dir):
            await self._landed(run_dir)
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
        # A renewal cut off by the cancellation still lands and is recorded: release the version it wrote.
        await asyncio.gather(*self._writes, return_exceptions=True)
        held, self._held, self._settling = list(self._held.values()), {}, {}
        await asyncio.gather(*(self._release(lease) for lease, _ in held))

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
            await asyncio.gather(*(self._renew(run_dir) for run_dir in list(self._held)))

    async def _renew(self, run_dir: str) -> None:
        """Renew one lease (side by side with the others, a bounded number at once); one taken over is
        dropped and its sessions here are released."""
        async with self._renewals, self._lock_of(run_dir):
            await self._landed(run_dir)
            held = self._held.get(run_dir)
            if held is None:
                return
            try:
                await self._renew_held(run_dir, held[0])
            except LeaseLostError:
                self._lost(run_dir)
            except BucketError as exc:  # tried again at the next round, while the lease lasts
                log.warning("run %s: the lease could not be renewed: %s", run_dir, exc)


class LeaseCollector:
    """Figures of the run leases at scrape time: how many are held, and the least time left on any."""

    def __init__(self, ownership: RunOwnership) -> None:
        self._ownership = ownership

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "summaryd_run_leases", "Run leases this daemon holds.", value=len(self._ownership.held())
        )
        left = self._ownership.margin_left()
        if left is not None:
            yield GaugeMetricFamily(
                "summaryd_run_lease_margin_seconds",
                "Least time left, by this daemon's clock, before a held run lease stops being written under "
                "(between a half and five sixths of --run-lease while renewals succeed; at 0 uploads wait).",
                value=left,
            )
