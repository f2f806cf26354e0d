"""Access to the bucket that holds a logdir on object storage (`s3://`, `gs://`, `az://`), through obstore.

Every call is async (obstore's I/O runs in Rust, off the event loop). The store reads the standard environment
(`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`; `GOOGLE_*`, `AZURE_*` the same
way). Conditional writes are the only way daemons coordinate: `create` (If-None-Match: *) and `replace`
(If-Match: ETag); S3 needs obstore's `conditional_put="etag"` for the latter, set here. What is removed while
others may write it goes by a conditional delete (`delete_if`, If-Match: ETag), and only on a store that shows
it honours one (`honours_conditional_delete`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from obstore.store import ObjectStore

log = logging.getLogger("summaryd.server.bucket")  # the name log lines carry, kept across moves
T = TypeVar("T")

SCHEMES = ("s3", "gs", "az")
AT_ONCE = 16
"""Requests of one bulk task (a sweep) in flight at once: 1,000 objects at 30 ms a request take seconds, not
minutes, and the daemon's own writes are not crowded out."""


class BucketError(Exception):
    """The bucket refused or failed a call; the message says which and why."""


class PreconditionFailedError(BucketError):
    """A conditional write lost: the object exists already (create) or changed since it was read (replace)."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object of a listing: its key below the logdir's prefix, size and ETag."""

    key: str
    size: int
    etag: str
    modified: float = 0.0
    """When it was last written (Unix seconds, the store's clock)."""


def is_bucket_url(logdir: str) -> bool:
    """True when `logdir` names a bucket (`s3://…`, `gs://…`, `az://…`) rather than a local directory."""
    scheme, sep, _ = logdir.partition("://")
    return bool(sep) and scheme in SCHEMES


def split_url(url: str) -> tuple[str, str, str]:
    """`(scheme, bucket, prefix)` of a bucket URL; the prefix has no leading or trailing slash.

    Raises:
        ValueError: the URL is not `SCHEME://BUCKET[/PREFIX]` with a supported scheme.
    """
    scheme, sep, rest = url.partition("://")
    bucket, _, prefix = rest.partition("/")
    if not sep or scheme not in SCHEMES or not bucket:
        raise ValueError(f"--logdir {url!r}: a bucket logdir is s3://BUCKET/PREFIX (or gs://, az://)")
    prefix = prefix.strip("/")
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise ValueError(f"--logdir {url!r}: the prefix has an empty, '.' or '..' component")
    return scheme, bucket, prefix


def _s3_options() -> dict[str, Any]:
    endpoint = (
        os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT")
    )
    options: dict[str, Any] = {"conditional_put": "etag"}
    if endpoint:
        # S3-compatible servers (MinIO, SeaweedFS, Ceph) serve buckets by path, not by host name.
        options["virtual_hosted_style_request"] = False
        if endpoint.startswith("http://"):
            options["client_options"] = {"allow_http": True}
    if not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
        options["region"] = "us-east-1"
    return options


class Bucket:
    """The objects below one logdir prefix; keys are relative to it."""

    def __init__(self, url: str, store: ObjectStore | None = None) -> None:
        from obstore.store import from_url

        self.url = url.rstrip("/")
        scheme, _, _ = split_url(url)
        self._store: ObjectStore = (
            store if store is not None else from_url(self.url, **(_s3_options() if scheme == "s3" else {}))
        )

    async def put(self, key: str, data: bytes | memoryview, metadata: dict[str, str] | None = None) -> str:
        """Write `key` whole (replacing any object there; large ones go up in parts), with user `metadata` that
        arrives with the object or not at all; return its ETag."""
        import obstore

        try:
            result = await obstore.put_async(self._store, key, data, attributes=dict(metadata) if metadata else None)
        except Exception as exc:
            raise BucketError(f"{self.url}/{key}: upload failed: {_reason(exc)}") from exc
        return result["e_tag"] or ""

    async def create(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> str:
        """Write `key` only if no object is there (one request, never in parts), with user `metadata`; return
        its ETag.

        Raises:
            PreconditionFailedError: an object exists at `key`.
        """
        return await self._conditional_put(key, data, "create", metadata)

    async def replace(self, key: str, data: bytes, etag: str) -> str:
        """Write `key` only if it is still the version `etag`; return the new ETag.

        Raises:
            PreconditionFailedError: the object changed (or vanished) since that version was read.
        """
        return await self._conditional_put(key, data, {"e_tag": etag})

    async def _conditional_put(self, key: str, data: bytes, mode: Any, metadata: dict[str, str] | None = None) -> str:
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotFoundError, PreconditionError

        attributes = dict(metadata) if metadata else None
        try:
            # A conditional put is never multipart (obstore sends one request): the condition holds for all of it.
            result = await obstore.put_async(self._store, key, data, mode=mode, attributes=attributes)
        except (AlreadyExistsError, PreconditionError, NotFoundError, FileNotFoundError) as exc:
            # The client retries a request whose answer was lost (a timeout, a reset connection): when the first
            # attempt landed, the retry fails its own condition. What is stored then is these very bytes (a
            # lease document names its holder and deadline, a segment is never empty), and the write is ours.
            stored = await self.get(key)
            if stored is not None and stored[0] == data:
                log.info("%s/%s: a conditional write's retry met the write itself; taken as done", self.url, key)
                return stored[1]
            raise PreconditionFailedError(f"{self.url}/{key}: {_reason(exc)}") from None
        except Exception as exc:
            raise BucketError(f"{self.url}/{key}: conditional write failed: {_reason(exc)}") from exc
        return result["e_tag"] or ""

    async def get(self, key: str) -> tuple[bytes, str] | None:
        """The content and ETag of `key`, or None when there is no such object."""
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            result = await obstore.get_async(self._store, key)
            data = await result.bytes_async()
        except (NotFoundError, FileNotFoundError):  # obstore raises the latter for a missing object
            return None
        except Exception as exc:
            raise BucketError(f"{self.url}/{key}: read failed: {_reason(exc)}") from exc
        return bytes(data), result.meta["e_tag"] or ""

    async def metadata(self, key: str) -> dict[str, str] | None:
        """The user metadata `key` was written with (a HEAD request), or None when there is no such object."""
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            result = await obstore.get_async(self._store, key, options={"head": True})
        except (NotFoundError, FileNotFoundError):
            return None
        except Exception as exc:
            raise BucketError(f"{self.url}/{key}: reading its metadata failed: {_reason(exc)}") from exc
        return {str(name): value for name, value in result.attributes.items()}

    async def size(self, key: str) -> int | None:
        """The size of `key` (a HEAD request), or None when there is no such object."""
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            result = await obstore.head_async(self._store, key)
        except (NotFoundError, FileNotFoundError):
            return None
        except Exception as exc:
            raise BucketError(f"{self.url}/{key}: reading its size failed: {_reason(exc)}") from exc
        return int(result["size"])

    async def list(self, prefix: str, after: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with the directory `prefix` (recursively), sorted by key; with `after`,
        only those whose key sorts after it (the store's start-after: the objects before are not sent)."""
        import obstore

        found: list[ObjectInfo] = []
        try:
            async for batch in obstore.list(self._store, prefix or None, offset=after or None):
                found += [
                    ObjectInfo(meta["path"], meta["size"], meta["e_tag"] or "", meta["last_modified"].timestamp())
                    for meta in batch
                ]
        except Exception as exc:
            raise BucketError(f"{self.url}/{prefix}: listing failed: {_reason(exc)}") from exc
        return sorted(found, key=lambda info: info.key)

    async def check(self) -> None:
        """List one object, to learn at start-up that the bucket exists and these credentials may read it.

        Raises:
            BucketError: naming what the store answered.
        """
        import obstore

        try:
            stream = obstore.list(self._store, None, chunk_size=1)
            async for _ in stream:
                break
        except Exception as exc:
            raise BucketError(f"{self.url}: cannot list the bucket: {_reason(exc)}") from exc

    async def delete(self, key: str) -> None:
        """Delete `key` (no error when it is gone already)."""
        import obstore

        try:
            await obstore.delete_async(self._store, key)
        except Exception as exc:
            raise BucketError(f"{self.url}/{key}: delete failed: {_reason(exc)}") from exc

    async def delete_if(self, key: str, etag: str) -> None:
        """Delete `key` only if it is still the version `etag` (no error when it is gone already).

        obstore has no conditional delete: the DELETE is signed by the store's own credentials (a URL signed
        for a minute) and sent with If-Match. A store that ignores the header deletes whatever is there, so a
        caller asks `honours_conditional_delete` first.

        Raises:
            PreconditionFailedError: the object changed since that version was read (or is gone: S3 answers
                both the same way).
            BucketError: the store cannot sign requests, or failed the call.
        """
        import obstore
        from obstore.store import AzureStore, GCSStore, S3Store

        store = self._store
        if not isinstance(store, S3Store | GCSStore | AzureStore):
            raise BucketError(f"{self.url}/{key}: this store signs no requests, so it has no conditional delete")
        try:
            url = await obstore.sign_async(store, "DELETE", key, datetime.timedelta(minutes=1))
        except Exception as exc:
            raise BucketError(f"{self.url}/{key}: signing a conditional delete failed: {_reason(exc)}") from exc
        try:
            status = await asyncio.to_thread(_send_delete, url, etag)
        except OSError as exc:
            raise BucketError(f"{self.url}/{key}: conditional delete failed: {exc}") from exc
        if status == 412:
            raise PreconditionFailedError(f"{self.url}/{key}: changed since it was read; kept")
        if status not in (200, 204, 404):
            raise BucketError(f"{self.url}/{key}: conditional delete answered HTTP {status}")

    async def honours_conditional_delete(self, scratch_key: str) -> bool:
        """Whether a conditional delete here removes only the version it names, tried on `scratch_key` (an
        object nobody else writes): one with a wrong ETag must be refused and leave the object, one with the
        right ETag must remove it. False on a store that ignores the condition, or fails either call."""
        try:
            etag = await self.put(scratch_key, b"summaryd: may a delete be conditional?")
            with contextlib.suppress(PreconditionFailedError):
                await self.delete_if(scratch_key, '"0"' if etag != '"0"' else '"1"')
            if await self.size(scratch_key) is None:
                log.warning(
                    "%s: the store ignores If-Match on DELETE; nothing another daemon may write is removed", self.url
                )
                return False
            await self.delete_if(scratch_key, etag)
            return await self.size(scratch_key) is None
        except BucketError as exc:
            log.warning("%s: conditional deletes cannot be used: %s", self.url, exc)
            return False
        finally:
            with contextlib.suppress(BucketError):
                await self.delete(scratch_key)


async def gather_bounded(works: Iterable[Awaitable[T]], at_once: int = AT_ONCE) -> list[T]:
    """The results of `works`, run side by side with at most `at_once` of them under way."""
    gate = asyncio.Semaphore(at_once)

    async def gated(work: Awaitable[T]) -> T:
        async with gate:
            return await work

    return await asyncio.gather(*(gated(work) for work in works))


def _send_delete(url: str, etag: str) -> int:
    """Send a signed DELETE with If-Match; the HTTP status. Blocking: run in a thread."""
    request = urllib.request.Request(url, method="DELETE", headers={"If-Match": etag})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _reason(exc: BaseException) -> str:
    """The first line of an obstore error (its messages carry the whole request chain below)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
