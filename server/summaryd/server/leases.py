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
- **release**: an expired lease written the same way, so that the next daemon need not wait.

Expiry compares the lease's wall-clock deadline with the reader's clock, so daemons' clocks must agree to well
within the lease's duration (NTP does). A lease is as trustworthy as the bucket: anyone who can write the prefix
can write one, naming any address, so the address is checked before a client is sent there
(`run_ownership.RunOwnership`, with `--peers`) and clients follow only addresses they were given.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from summaryd.server.bucket import Bucket, PreconditionFailedError

log = logging.getLogger(__name__)

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

    def document(self) -> bytes:
        return json.dumps({"holder": self.holder, "address": self.address, "expires": self.expires}).encode()


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
    ) -> None:
        self.bucket = bucket
        self.holder = holder
        self.address = address
        self.duration = duration
        self._clock = clock

    async def acquire(self, run_dir: str) -> Lease:
        """Take (or renew) the lease of `run_dir`.

        Raises:
            LeaseHeldError: another daemon holds a live lease on the run.
        """
        key = lease_key(run_dir)
        # Two rounds: a lost race (create or take-over) is answered by reading what the winner wrote.
        for _ in range(2):
            current = await self.read(run_dir)
            if current is None:
                try:
                    return await self._write(run_dir, key, None)
                except PreconditionFailedError:
                    continue
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
                return await self._write(run_dir, key, current.etag)
            except PreconditionFailedError:
                continue
        current = await self.read(run_dir)
        if current is not None and current.holder != self.holder:
            raise LeaseHeldError(run_dir, current.holder, current.address, current.expires)
        raise LeaseLostError(f"run {run_dir}: the lease changed under every attempt to take it")

    async def renew(self, lease: Lease) -> Lease:
        """Extend `lease` by the duration from now.

        Raises:
            LeaseLostError: the lease is no longer the version this daemon wrote.
        """
        try:
            return await self._write(lease.run_dir, lease_key(lease.run_dir), lease.etag)
        except PreconditionFailedError:
            raise LeaseLostError(f"run {lease.run_dir}: the lease was taken over") from None

    async def release(self, lease: Lease) -> None:
        """Give the lease up (write it expired), unless it was taken over already."""
        expired = Lease(lease.run_dir, self.holder, self.address, 0.0, lease.etag)
        with contextlib.suppress(PreconditionFailedError):
            await self.bucket.replace(lease_key(lease.run_dir), expired.document(), lease.etag)

    async def read(self, run_dir: str) -> Lease | None:
        """The run's lease as stored, or None when there is none (or it cannot be parsed: then it is replaced)."""
        found = await self.bucket.get(lease_key(run_dir))
        if found is None:
            return None
        data, etag = found
        try:
            doc = json.loads(data)
            return Lease(run_dir, str(doc["holder"]), str(doc["address"]), float(doc["expires"]), etag)
        except (ValueError, KeyError, TypeError):
            # Unreadable: treat it as an expired lease of nobody, to be replaced by ETag like any other.
            return Lease(run_dir, "", "", 0.0, etag)

    async def _write(self, run_dir: str, key: str, etag: str | None) -> Lease:
        lease = Lease(run_dir, self.holder, self.address, self._clock() + self.duration, "")
        if etag is None:
            new_etag = await self.bucket.create(key, lease.document())
        else:
            new_etag = await self.bucket.replace(key, lease.document(), etag)
        return Lease(run_dir, lease.holder, lease.address, lease.expires, new_etag)
