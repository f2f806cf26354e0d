"""Session state in the bucket: what any daemon needs to resume a session another daemon served.

One small JSON object per session, `.summaryd/sessions/<id>` below the logdir's prefix: its run, the highest
sequence number whose events are uploaded (`durable`), and whether it was closed. It is written after the
segment holding those events is uploaded, only with conditional puts (create if absent, else replace by the
ETag just read), and never moves backwards: a write that loses a race reads the winner's and merges. A daemon
that does not know a session (its disk lost, or the session served elsewhere) resumes it at `durable`, so
nothing in the bucket is written twice and nothing beyond it is taken for delivered.

A daemon lost between a segment's upload and the state's write leaves events the state does not count; the
segment names them itself (`segment_sessions`). `since` bounds the search for them: no segment whose key sorts
before it holds any of the session's events beyond `durable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field

from summaryd.server.storage.bucket.leases import RunLeases
from summaryd.server.storage.bucket.store import Bucket, BucketError, PreconditionFailedError, gather_bounded

log = logging.getLogger("summaryd.server.bucket_sessions")  # the name log lines carry, kept across moves

SESSION_PREFIX = ".summaryd/sessions/"
_ROUNDS = 5
SWEEP_SECS = 3600.0
"""How often a daemon removes the state of sessions closed (and the leases expired) longer ago than the
retention, at most."""
PROBE_PREFIX = ".summaryd/probes/"
"""Scratch objects on which a daemon tries whether the store honours conditional deletes."""


@dataclass(frozen=True)
class DurableSession:
    """A session as the bucket knows it."""

    session_id: str
    run_dir: str
    durable: int
    closed: bool
    since: str = field(default="", compare=False)
    """A segment key: the segments before it hold nothing of the session beyond `durable` (a search bound)."""

    def document(self) -> bytes:
        doc = {"run": self.run_dir, "durable": self.durable, "closed": self.closed, "since": self.since}
        return json.dumps(doc).encode()

    def merged(self, other: DurableSession) -> DurableSession:
        """Both states at once: the higher watermark, closed if either says so, the later search bound (each
        bound holds for its watermark, so for the higher one too)."""
        return DurableSession(
            self.session_id,
            self.run_dir,
            max(self.durable, other.durable),
            self.closed or other.closed,
            max(self.since, other.since),
        )


def session_key(session_id: str) -> str:
    """The state object of `session_id`, relative to the logdir's prefix."""
    return SESSION_PREFIX + session_id


class BucketSessions:
    """Reads and writes session state objects of one bucket logdir."""

    def __init__(self, bucket: Bucket) -> None:
        self.bucket = bucket

    async def get(self, session_id: str) -> DurableSession | None:
        """The session's state, or None when the bucket has none (or an unreadable one).

        Raises:
            BucketError: the bucket could not be read.
        """
        found = await self._read(session_id)
        return found[0] if found is not None and found[0].run_dir else None

    async def put(self, state: DurableSession) -> DurableSession:
        """Write `state`, merged with what the bucket holds; return what was written.

        Raises:
            BucketError: the bucket could not be read or written, or the object changed under every attempt.
        """
        key = session_key(state.session_id)
        for _ in range(_ROUNDS):
            found = await self._read(state.session_id)
            try:
                if found is None:
                    await self.bucket.create(key, state.document())
                    return state
                current, etag = found
                merged = state.merged(current)
                if merged != current or merged.since != current.since:
                    await self.bucket.replace(key, merged.document(), etag)
                return merged
            except PreconditionFailedError:
                continue  # another writer won: read theirs and merge again
        raise PreconditionFailedError(f"{self.bucket.url}/{key}: changed under every attempt to write it")

    async def sweep(self, before: float, conditional: bool = True) -> int:
        """Remove the state of every session closed and not written since `before` (Unix seconds, the store's
        clock); return how many. The delete names the version read (`Bucket.delete_if`; a plain delete where
        the store has no conditional one, `conditional=False`): a write that lands meanwhile is kept until the
        next sweep. Even a plain delete is safe here: a closed state never changes meaning (a later write
        merges to closed again, and recreates it at worst); a session still open is never removed, and a
        session forgotten this way is one the local stores forget after the same retention too.

        Raises:
            BucketError: the bucket could not be listed.
        """
        found = [info for info in await self.bucket.list(SESSION_PREFIX) if info.modified and info.modified < before]
        return sum(await gather_bounded(self._sweep_one(info.key, conditional) for info in found))

    async def _sweep_one(self, key: str, conditional: bool) -> bool:
        session_id = key[len(SESSION_PREFIX) :]
        try:
            found = await self._read(session_id)
            if found is None or not found[0].closed or not found[0].run_dir:
                return False
            if conditional:
                await self.bucket.delete_if(key, found[1])
            else:
                await self.bucket.delete(key)
        except PreconditionFailedError:
            log.info("session %s: its state was written while it was being removed; kept", session_id)
            return False
        except BucketError as exc:  # tried again at the next sweep
            log.warning("session %s: its closed state could not be removed: %s", session_id, exc)
            return False
        return True

    async def sweep_forever(
        self, retention_secs: float, leases: RunLeases | None = None, every: float = SWEEP_SECS
    ) -> None:
        """Sweep the closed sessions' state, and the expired `leases`, past `retention_secs`: every `every`
        seconds, or every half retention when that is shorter (from a little after the start, so that daemons
        started together do not sweep at once). Leases go only where the store honours a conditional delete
        (tried on a scratch object of this daemon's at each sweep); sessions' state goes either way."""
        every = min(every, retention_secs / 2)
        scratch = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        await asyncio.sleep(every * (0.1 + 0.9 * (time.time() % 1)))
        while True:
            with contextlib.suppress(BucketError):
                conditional = await self.bucket.honours_conditional_delete(scratch)
                before = time.time() - retention_secs
                removed = await self.sweep(before, conditional)
                if removed:
                    log.info("removed the state of %d sessions closed over the retention ago", removed)
                if leases is not None and conditional:
                    removed = await leases.sweep(before)
                    if removed:
                        log.info("removed the leases of %d runs expired over the retention ago", removed)
            await asyncio.sleep(every)

    async def _read(self, session_id: str) -> tuple[DurableSession, str] | None:
        found = await self.bucket.get(session_key(session_id))
        if found is None:
            return None
        data, etag = found
        try:
            doc = json.loads(data)
            state = DurableSession(
                session_id, str(doc["run"]), int(doc["durable"]), bool(doc["closed"]), str(doc.get("since", ""))
            )
        except (ValueError, KeyError, TypeError):
            # Unreadable: nothing is known of the session; replaced by ETag like any other version.
            state = DurableSession(session_id, "", 0, False)
        return state, etag
