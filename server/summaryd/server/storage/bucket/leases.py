"""Run ownership through the bucket: one lease object per run, written only with conditional puts.

A run is written by one daemon at a time. Its lease is the object `.summaryd/leases/RUN.lease` below the
logdir's prefix, a small JSON document naming the holder (a daemon's unique id), the address clients should
be sent to, and when the lease expires (wall-clock seconds). The rules:

- **acquire**: no lease object → create it with If-None-Match (two daemons racing: one wins, the other reads the
  winner's); the holder's own lease → renew it; someone else's that has expired → replace it with If-Match on
  the ETag just read (two daemons taking over at once: one wins); a live lease of another holder at this
  daemon's own address → taken over the same way at once (this daemon's previous incarnation, which lost its
  disk and with it its id: it no longer listens there, and sending its clients here would send them back
  here); someone else's live lease → `LeaseHeldError`, which names the holder's address;
- **renew**: replace with If-Match on the ETag of the holder's last write; a mismatch means another daemon took
  the lease over (`LeaseLostError`), and the holder must stop writing the run;
- **release**: an expired lease written the same way, so that the next daemon need not wait;
- **sweep** (any daemon, on a store that honours conditional deletes): a lease expired and not written for the
  retention is removed, its files closed to their holder first, by a delete conditional on the version read: an
  acquirer that took it meanwhile keeps its lease (see DESIGN.md, *What the bucket keeps*).

Expiry compares the lease's wall-clock deadline with the reader's clock, so daemons' clocks must agree to well
within the lease's duration (NTP does); the holder itself judges by its monotonic clock (`Lease.live`). A lease
is as trustworthy as the bucket: anyone who can write the prefix can write one, naming any address, so the
address is checked before a client is sent there (`run_ownership.RunOwnership`, with `--peers`) and clients
follow only addresses they were given.

**Fencing.** The document also names, per directory, the staged file whose segments the holder uploads
(`files`): a holder uploads a file's segments only once its lease names the file (`RunLeases.renew` with it,
by ETag). A daemon that takes the lease from another holder moves those names to `unfenced`, and before it
writes anything of the run closes each of those files to its old holder for good (`segments.fence_file`: an
empty object created at the key its next segment would have), then writes the lease again without them. A
paused holder that wakes up can thus neither start a new file (its lease write fails by ETag) nor add a
segment to one it had (the key is taken): see DESIGN.md, *Fencing*.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from summaryd.server.storage.bucket.segments import fence_file
from summaryd.server.storage.bucket.store import Bucket, BucketError, PreconditionFailedError, gather_bounded

log = logging.getLogger("summaryd.server.leases")  # the name log lines carry, kept across moves

LEASE_PREFIX = ".summaryd/leases/"
LEASE_SUFFIX = ".lease"


class LeaseHeldError(Exception):
    """Another daemon holds the run's lease; clients belong at `address`."""

    def __init__(self, run_dir: str, holder: str, address: str, expires: float) -> None:
        super().__init__(f"run {run_dir} is written by the daemon at {address or holder} until its lease expires")
        self.run_dir = run_dir
        self.holder = holder
        self.address = address
        self.expires = expires


class LeaseLostError(Exception):
    """The lease was taken over (or removed) since this daemon last wrote it."""


@dataclass(frozen=True)
class Lease:
    """A lease as last written or read: its holder and the ETag that a conditional write must name."""

    run_dir: str
    holder: str
    address: str
    expires: float
    etag: str
    files: tuple[tuple[str, str], ...] = ()
    """(directory, staged file name) whose segments the holder may upload under this lease."""
    unfenced: tuple[tuple[str, str], ...] = ()
    """Files of earlier holders not yet closed to them (`segments.fence_file`): done before anything is written."""
    renewed: float = dataclasses.field(default=0.0, compare=False)
    """The holder's monotonic clock when the write that made this version began (0: read, not written here)."""

    def document(self) -> bytes:
        doc = {"holder": self.holder, "address": self.address, "expires": self.expires}
        if self.files:
            doc["files"] = [list(pair) for pair in self.files]
        if self.unfenced:
            doc["unfenced"] = [list(pair) for pair in self.unfenced]
        return json.dumps(doc).encode()

    def live(self, now: float, duration: float) -> bool:
        """Whether the holder may still write under this version at monotonic time `now`: until the start of
        the write that made it plus the lease, less a margin for the other daemons' clocks (`margin`). A
        version another daemon may judge expired is never written under, whatever the wall clock says."""
        return self.renewed > 0 and now < self.renewed + duration - margin(duration)

    def naming(self, run_dir: str, name: str) -> Lease:
        """This lease naming `name` as the staged file of `run_dir` whose segments are uploaded (to be written)."""
        files = tuple(sorted({**dict(self.files), run_dir: name}.items()))
        return dataclasses.replace(self, files=files)


def margin(duration: float) -> float:
    """How long before its lease expires a holder stops writing under it: a sixth of the lease (5 s of the
    default 30 s), for other daemons' wall clocks running ahead of this one's, and the rates of both."""
    return duration / 6


def lease_key(run_dir: str) -> str:
    """The lease object of `run_dir`, relative to the logdir's prefix."""
    return f"{LEASE_PREFIX}{run_dir}{LEASE_SUFFIX}"


class RunLeases:
    """The leases one daemon (`holder`, reachable at `address`) takes, renews and releases."""

    def __init__(
        self,
        bucket: Bucket,
        holder: str,
        address: str,
        duration: float,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bucket = bucket
        self.holder = holder
        self.address = address
        self.duration = duration
        self._clock = clock
        self.monotonic = monotonic

    async def acquire(self, run_dir: str) -> Lease:
        """Take (or renew) the lease of `run_dir`.

        Raises:
            LeaseHeldError: another daemon holds a live lease on the run.
        """
        # Two rounds: a lost race (create or take-over) is answered by reading what the winner wrote.
        for _ in range(2):
            current = await self.read(run_dir)
            if current is None:
                try:
                    return await self._write(Lease(run_dir, self.holder, self.address, 0.0, ""), None)
                except PreconditionFailedError:
                    continue
            if current.holder == self.holder:  # its own (from before a restart): its files stay its own
                taken = current
            else:  # another holder's files are closed to it before this daemon writes the run
                unfenced = tuple(sorted({*current.unfenced, *current.files}))
                taken = Lease(run_dir, self.holder, self.address, 0.0, "", (), unfenced)
            if current.holder != self.holder and current.expires > self._clock():
                if not (self.address and current.address == self.address):
                    raise LeaseHeldError(run_dir, current.holder, current.address, current.expires)
                log.warning(
                    "run %s: its live lease names this daemon's address %s under another id (%s: this daemon "
                    "before it lost its state); taking it over",
                    run_dir,
                    self.address,
                    current.holder,
                )
            try:
                return await self._write(taken, current.etag)
            except PreconditionFailedError:
                continue
        current = await self.read(run_dir)
        if current is not None and current.holder != self.holder:
            raise LeaseHeldError(run_dir, current.holder, current.address, current.expires)
        raise LeaseLostError(f"run {run_dir}: the lease changed under every attempt to take it")

    async def renew(self, lease: Lease, etag: str | None = None) -> Lease:
        """Extend `lease` by the duration from now (written as given: its files and unfenced ones), replacing
        the version `etag` (default: `lease.etag`).

        Raises:
            LeaseLostError: the lease is no longer the version this daemon wrote.
        """
        try:
            return await self._write(lease, lease.etag if etag is None else etag)
        except PreconditionFailedError:
            raise LeaseLostError(f"run {lease.run_dir}: the lease was taken over") from None

    async def release(self, lease: Lease) -> None:
        """Give the lease up (write it expired), unless it was taken over already."""
        # Its files stay named: the next holder closes them to this one, as after a takeover.
        expired = dataclasses.replace(lease, expires=0.0)
        with contextlib.suppress(PreconditionFailedError):
            await self.bucket.replace(lease_key(lease.run_dir), expired.document(), lease.etag)

    async def sweep(self, before: float) -> int:
        """Remove the lease of every run that has expired (released, or its holder gone) and was not written
        since `before` (Unix seconds, the store's clock); return how many. For a store where
        `Bucket.honours_conditional_delete`.

        Each file the lease names is closed to its holder first (`segments.fence_file`), as a takeover does: a
        holder that comes back with staged leftovers then finds neither the lease that said no other daemon
        held the run since, nor a key to add them at. The delete names the version read: an acquirer that
        replaced it meanwhile keeps its lease (the delete is refused), and one that creates the lease after the
        delete writes an object the delete never named.

        Raises:
            BucketError: the leases could not be listed.
        """
        now = self._clock()
        found = [
            info
            for info in await self.bucket.list(LEASE_PREFIX)
            if info.key.endswith(LEASE_SUFFIX) and info.modified and info.modified < before
        ]
        return sum(await gather_bounded(self._sweep_one(info.key, now) for info in found))

    async def _sweep_one(self, key: str, now: float) -> bool:
        run_dir = key[len(LEASE_PREFIX) : -len(LEASE_SUFFIX)]
        try:
            lease = await self.read(run_dir)
            if lease is None or lease.expires > now:
                return False
            for directory, name in sorted({*lease.files, *lease.unfenced}):
                await fence_file(self.bucket, directory, name)
            await self.bucket.delete_if(key, lease.etag)
        except PreconditionFailedError:
            log.info("run %s: its lease was written while it was being removed; kept", run_dir)
            return False
        except BucketError as exc:  # tried again at the next sweep
            log.warning("run %s: its expired lease could not be removed: %s", run_dir, exc)
            return False
        return True

    async def read(self, run_dir: str) -> Lease | None:
        """The run's lease as stored, or None when there is none (or it cannot be parsed: then it is replaced)."""
        found = await self.bucket.get(lease_key(run_dir))
        if found is None:
            return None
        data, etag = found
        try:
            doc = json.loads(data)
            return Lease(
                run_dir,
                str(doc["holder"]),
                str(doc["address"]),
                float(doc["expires"]),
                etag,
                _pairs(doc.get("files", [])),
                _pairs(doc.get("unfenced", [])),
            )
        except (ValueError, KeyError, TypeError):
            # Unreadable: treat it as an expired lease of nobody, to be replaced by ETag like any other.
            return Lease(run_dir, "", "", 0.0, etag)

    async def _write(self, lease: Lease, etag: str | None) -> Lease:
        # The monotonic clock is read before the request goes: the holder's term counts from no later than the
        # instant the other daemons' deadline (`expires`, by this wall clock) does.
        renewed = self.monotonic()
        lease = dataclasses.replace(
            lease, holder=self.holder, address=self.address, expires=self._clock() + self.duration, renewed=renewed
        )
        key = lease_key(lease.run_dir)
        if etag is None:
            new_etag = await self.bucket.create(key, lease.document())
        else:
            new_etag = await self.bucket.replace(key, lease.document(), etag)
        return dataclasses.replace(lease, etag=new_etag)


def _pairs(value: object) -> tuple[tuple[str, str], ...]:
    """(directory, file name) pairs of a lease document; anything else in it is a TypeError (unreadable)."""
    if not isinstance(value, list):
        raise TypeError("not a list")
    return tuple(sorted((str(a), str(b)) for a, b in value))
