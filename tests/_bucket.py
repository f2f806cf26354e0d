"""A logdir on a SeaweedFS bucket, for the objstore tests: the tests' bucket, a daemon on a prefix of it, what
the daemons left there (segments, their steps read with TensorBoard's loader, a run's lease, a session's durable
state), and a session driven by hand over gRPC. The `seaweed` and `logdir_url` fixtures in `conftest.py` make the
server and a fresh prefix."""

from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path

import grpc
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from _seaweed import SeaweedServer
from _support import Daemon, read_events, start_daemon
from summaryd.server.storage.bucket.leases import Lease, RunLeases
from summaryd.server.storage.bucket.segments import parse_segment
from summaryd.server.storage.bucket.sessions import BucketSessions, DurableSession
from summaryd.server.storage.bucket.store import Bucket
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

BUCKET = "summaryd-tests"


def start_bucket_daemon(tmp_path: Path, url: str, *flags: str) -> Daemon:
    return start_daemon(tmp_path, "--logdir", url, "--state-dir", str(tmp_path / "state"), *flags)


def daemon_in(workdir: Path, url: str, *flags: str) -> Daemon:
    """A daemon on the bucket logdir `url` with a state directory of its own, under `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    return start_bucket_daemon(workdir, url, *flags)


def prefix_of(url: str) -> str:
    return url.split("/", 3)[3]


def segments(seaweed: SeaweedServer, url: str, run: str) -> list[tuple[str, int]]:
    """`(key, size)` of every segment of `run`, in key order."""
    import obstore  # the s3 extra: imported when run, so that the default tier collects this module without it

    store = seaweed.store(BUCKET, prefix_of(url))
    found = [(meta["path"], meta["size"]) for meta in obstore.list(store, run + "/").collect()]
    return sorted((key, size) for key, size in found if parse_segment(key) is not None)


def steps_from_bucket(seaweed: SeaweedServer, url: str, run: str, into: Path) -> collections.Counter[int]:
    """How often each step occurs in `run`'s segments, each read whole with TensorBoard's loader."""
    import obstore

    store = seaweed.store(BUCKET, prefix_of(url))
    into.mkdir(parents=True, exist_ok=True)
    steps: collections.Counter[int] = collections.Counter()
    for key, size in segments(seaweed, url, run):
        local = into / key.rsplit("/", 1)[1]
        local.write_bytes(bytes(obstore.get(store, key).bytes()))
        events = read_events(local)
        assert sum(8 + 4 + len(e.SerializeToString()) + 4 for e in events) == size, f"{key}: not whole records"
        steps.update(e.step for e in events if e.HasField("summary"))
    return steps


def lease_of(url: str, run: str) -> Lease | None:
    return asyncio.run(RunLeases(Bucket(url), "reader", "", 30.0).read(run))


def state_of(url: str, session_id: str) -> DurableSession | None:
    return asyncio.run(BucketSessions(Bucket(url)).get(session_id))


def batch(session_id: str, first: int, last: int) -> pb.WriteRequest:
    """Events `first`..`last`, each a scalar at step = its sequence number - 1."""
    events = [
        Event(wall_time=time.time(), step=seq - 1, summary=Summary(value=[Summary.Value(tag="loss", simple_value=seq)]))
        for seq in range(first, last + 1)
    ]
    return pb.WriteRequest(session_id=session_id, first_sequence=first, events=[e.SerializeToString() for e in events])


def write(stub: pb_grpc.SummariesStub, *requests: pb.WriteRequest) -> pb.WriteAck:
    """Send `requests` on one stream; the last ack."""
    acks = list(stub.Write(iter(requests), timeout=30))
    assert len(acks) == len(requests)
    return acks[-1]


def stub_of(address: str, channels: list[grpc.Channel]) -> pb_grpc.SummariesStub:
    channels.append(grpc.insecure_channel(address))
    return pb_grpc.SummariesStub(channels[-1])
