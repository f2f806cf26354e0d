"""Damaged state: every state file cut short, bit-flipped, replaced by garbage or by a directory.

Real clients write before the damage (spools delivered by `summaryd replay`, some sessions left open by a
SIGKILL) and replay after it; for every damage the daemon starts (or refuses with one line), its log says what
it kept aside, the damaged bytes are still there, and TensorBoard's loader finds no event written twice: a
session whose record may be lost is refused, one whose record survived is deduplicated, a new one opens.
"""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from _support import Daemon, event_files, read_events, replay, start_daemon, unused_port
from summaryd.cli import main
from summaryd.client import SummaryWriter
from summaryd.client._sender._replay import open_request
from summaryd.client._spool import MANIFEST
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import whole_records

RUNS = 5
STEPS = 100


def spool_runs(tmp_path: Path) -> list[Path]:
    """RUNS writers log STEPS scalars each while the daemon is away: RUNS spools, first sequence 1."""
    root = tmp_path / "spool"
    for run in range(RUNS):
        w = SummaryWriter(f"run-{run}", address=f"127.0.0.1:{unused_port()}", worker="", spool_dir=root)
        for step in range(STEPS):
            w.add_scalar("loss", step, step)
        assert w.close(timeout=0.5).spooled == STEPS
    spools = sorted(p for p in root.iterdir() if (p / MANIFEST).is_file())
    assert len(spools) == RUNS
    return sorted(spools, key=lambda p: json.loads((p / MANIFEST).read_text())["run"])


def deliver_without_closing(daemon: Daemon, spool: Path) -> None:
    """What a replay does up to its CloseSession: the session's file stays open, its journal in `open/`."""
    manifest = json.loads((spool / MANIFEST).read_text())
    events = list(whole_records((spool / manifest["file"]).read_bytes()))[1:]
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.SummariesStub(channel)
        stub.OpenSession(open_request(manifest, 1, "test"), timeout=10)
        requests = [
            pb.WriteRequest(session_id=manifest["session_id"], first_sequence=1 + i, events=events[i : i + 10])
            for i in range(0, len(events), 10)
        ]
        acks = list(stub.Write(iter(requests), timeout=30))
        assert acks[-1].acked_sequence == len(events)


def forget_delivery(spool: Path) -> None:
    """The spool's record of its delivery is lost (a replay killed before it wrote it): a replay sends again."""
    manifest = json.loads((spool / MANIFEST).read_text())
    manifest.pop("delivered_through", None)
    manifest.pop("replayed", None)
    (spool / MANIFEST).write_text(json.dumps(manifest))


def written_before_damage(
    tmp_path: Path, daemons: list[Daemon], capsys: pytest.CaptureFixture[str]
) -> tuple[Path, list[Path]]:
    """Runs 0-2 replayed and closed (records in `sessions`), runs 3-4 delivered and left open by a SIGKILL
    (their journals in `open/`). Returns the logdir and the spools."""
    spools = spool_runs(tmp_path)
    daemon = start_daemon(tmp_path)
    daemons.append(daemon)
    for spool in spools[:3]:
        [result] = replay(spool, daemon.address, capsys, keep=True)
        assert (result["ok"], result["sent"]) == (True, STEPS)
    for spool in spools[3:]:
        deliver_without_closing(daemon, spool)
    os.kill(daemon.proc.pid, signal.SIGKILL)
    daemon.proc.wait(30)
    state = daemon.logdir / ".summaryd"
    assert (state / "sessions").stat().st_size > 0 and len(list((state / "open").glob("*.journal"))) == 2
    return daemon.logdir, spools


def truncate(path: Path) -> None:
    """Cut inside line 1: every line after it is gone (a torn append cuts only the last line)."""
    with open(path, "r+b") as f:
        f.truncate(20)


def bitflip(path: Path) -> None:
    """Flip one bit of line 1, inside its JSON (as a bad disk or a stray write would)."""
    data = bytearray(path.read_bytes())
    data[12] ^= 0x04
    path.write_bytes(bytes(data))


def garbage(path: Path) -> None:
    size = path.stat().st_size if path.is_file() else 200
    if path.is_dir():
        shutil.rmtree(path)
    path.write_bytes(random.Random(7).randbytes(max(size, 64)))


def directory(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "stray").write_text("x")


DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncated": truncate,
    "bitflip": bitflip,
    "garbage": garbage,
    "directory": directory,
}


def target(state: Path, name: str) -> Path:
    if name == "journal":  # the one of run-3's file
        [journal] = [p for p in (state / "open").glob("*.journal") if b'"run":"run-3"' in p.read_bytes()]
        return journal
    return state / name


def steps_per_run(logdir: Path) -> dict[str, collections.Counter[int]]:
    """Each run's scalar steps with their counts, read with TensorBoard's loader."""
    counts: dict[str, collections.Counter[int]] = {}
    for run in range(RUNS):
        counter: collections.Counter[int] = collections.Counter()
        for path in event_files(logdir / f"run-{run}"):
            counter.update(e.step for e in read_events(path) if e.HasField("summary"))
        counts[f"run-{run}"] = counter
    return counts


def assert_once(logdir: Path) -> dict[str, collections.Counter[int]]:
    counts = steps_per_run(logdir)
    for run, counter in counts.items():
        doubled = {step: n for step, n in counter.items() if n > 1}
        assert not doubled, f"{run}: events written twice: {doubled}"
    return counts


def replay_after(spools: list[Path], daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """`summaryd replay` every spool again, as if no replay had ever finished; a refusal is an answer here."""
    results = []
    for spool in spools:
        forget_delivery(spool)
        capsys.readouterr()
        main(["replay", str(spool), "--address", daemon.address, "--json", "--keep"])
        [result] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        results.append(result)
    return results


def new_session_opens(daemon: Daemon) -> None:
    with SummaryWriter("fresh", address=daemon.address, worker="") as w:
        for step in range(10):
            w.add_scalar("loss", step, step)
        report = w.sender.close(timeout=30)
    assert report.delivered == 10, report
    assert sorted(e.step for p in event_files(daemon.logdir / "fresh") for e in read_events(p) if e.step) == list(
        range(1, 10)
    )


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("name", ["sessions", "journal"])
def test_a_damaged_state_file_is_kept_aside_and_nothing_is_written_twice(
    tmp_path: Path, daemons: list[Daemon], capsys: pytest.CaptureFixture[str], name: str, damage: str
) -> None:
    logdir, spools = written_before_damage(tmp_path, daemons, capsys)
    state = logdir / ".summaryd"
    path = target(state, name)
    before = path.read_bytes()
    DAMAGES[damage](path)
    damaged_bytes = path.read_bytes() if path.is_file() else None

    daemon = start_daemon(tmp_path, logdir=logdir)
    daemons.append(daemon)
    results = replay_after(spools, daemon, capsys)
    counts = assert_once(logdir)
    new_session_opens(daemon)

    log = daemon.log()
    assert "Traceback" not in log
    [kept] = state.glob("damaged-*")
    [line] = [line for line in log.splitlines() if "kept it as" in line]
    assert " ERROR " in line and kept.name in line, line
    if damaged_bytes is not None:
        assert kept.read_bytes() == damaged_bytes  # kept as found, never rewritten
    else:
        assert kept.is_dir()
    assert before != damaged_bytes
    for spool, result in zip(spools, results, strict=True):
        run = json.loads((spool / MANIFEST).read_text())["run"]
        if result["ok"]:
            # Delivered exactly once: what the daemon held, plus what the replay sent again.
            assert sorted(counts[run]) == list(range(STEPS)), (run, result)
        else:
            assert "cannot be resumed" in str(result["error"]), result
    refused = [r["run"] for r in results if not r["ok"]]
    if name == "sessions" and damage == "bitflip":
        # The good lines after the flipped one are kept: each closed session has a later line there.
        assert not refused, results
    elif name == "journal":
        assert refused == ["run-3"], results  # the journal of run-3's file: the other runs are deduplicated
    else:
        assert refused == ["run-0", "run-1", "run-2"], results  # the store's sessions; the journals' are known


def test_harmless_damage_is_quiet_and_a_lock_directory_refuses_with_one_line(
    tmp_path: Path, daemons: list[Daemon], capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged lock (it holds only the pid and a size witness) and a torn last line of the store (what a crash
    can leave) cost nothing and are not reported as damage; `lock` replaced by a directory is not taken over (a
    daemon may hold the file it replaced): one line, exit code 1, and once it is removed all is as before."""
    logdir, spools = written_before_damage(tmp_path, daemons, capsys)
    state = logdir / ".summaryd"
    for damage in ("truncated", "bitflip", "garbage"):
        DAMAGES[damage](state / "lock")
        with open(state / "sessions", "ab") as f:
            f.write(b'0123abcd {"q":')
        daemon = start_daemon(tmp_path, logdir=logdir)
        daemons.append(daemon)
        results = replay_after(spools, daemon, capsys)
        assert all(r["ok"] for r in results), results
        assert all(sorted(c) == list(range(STEPS)) for c in assert_once(logdir).values())
        assert "ERROR" not in daemon.log() and not list(state.glob("damaged-*"))
        os.kill(daemon.proc.pid, signal.SIGKILL)
        daemon.proc.wait(30)

    directory(state / "lock")
    argv = [sys.executable, "-m", "summaryd.server", "serve", "--logdir", str(logdir), "--listen", "127.0.0.1:0"]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert "'lock' is not a regular file" in line and "remove it" in line, line
    shutil.rmtree(state / "lock")
    daemon = start_daemon(tmp_path, logdir=logdir)
    daemons.append(daemon)
    results = replay_after(spools, daemon, capsys)
    assert all(r["ok"] for r in results), results
    assert all(sorted(c) == list(range(STEPS)) for c in assert_once(logdir).values())


def test_open_directory_replaced_by_a_file_is_kept_aside(
    tmp_path: Path, daemons: list[Daemon], capsys: pytest.CaptureFixture[str]
) -> None:
    """The journals of the open files are gone with it: their sessions are refused, the others deduplicated; a
    session started after the damage, spooled while the daemon was away, is delivered."""
    logdir, spools = written_before_damage(tmp_path, daemons, capsys)
    state = logdir / ".summaryd"
    shutil.rmtree(state / "open")
    garbage(state / "open")
    time.sleep(0.01)  # the session below starts after the damaged entry was last written
    later = tmp_path / "later"
    w = SummaryWriter("later", address=f"127.0.0.1:{unused_port()}", worker="", spool_dir=later)
    for step in range(STEPS):
        w.add_scalar("loss", step, step)
    assert w.close(timeout=0.5).spooled == STEPS
    daemon = start_daemon(tmp_path, logdir=logdir)
    daemons.append(daemon)
    [result] = replay(later, daemon.address, capsys, keep=True)
    assert (result["ok"], result["sent"]) == (True, STEPS)
    results = replay_after(spools, daemon, capsys)
    assert_once(logdir)
    assert [r["ok"] for r in results] == [True, True, True, False, False], results
    [kept] = state.glob("damaged-*-open")
    assert kept.is_file()
    assert "open is not a directory" in daemon.log()
    new_session_opens(daemon)


def test_a_damaged_loss_record_still_refuses(
    tmp_path: Path, daemons: list[Daemon], capsys: pytest.CaptureFixture[str]
) -> None:
    """`losses` itself damaged: its modification time stands for what it held; nothing is written twice."""
    logdir, spools = written_before_damage(tmp_path, daemons, capsys)
    state = logdir / ".summaryd"
    garbage(state / "sessions")
    daemon = start_daemon(tmp_path, logdir=logdir)
    daemon.terminate()
    garbage(state / "losses")
    daemon = start_daemon(tmp_path, logdir=logdir)
    daemons.append(daemon)
    results = replay_after(spools, daemon, capsys)
    assert_once(logdir)
    assert [r["ok"] for r in results] == [False, False, False, True, True], results
    assert len(list(state.glob("damaged-*-losses"))) == 1


def test_a_journal_naming_a_run_outside_the_logdir_touches_nothing(tmp_path: Path, daemons: list[Daemon]) -> None:
    """A crafted journal (`"run":"../victim"`) is kept aside; the file it names is not cut."""
    from summaryd.server.storage.journal import encode

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "events.out.tfevents.1.x").write_bytes(b"precious" * 100)
    logdir = tmp_path / "runs"
    (logdir / ".summaryd" / "open").mkdir(parents=True)
    crafted = encode({"run": "../victim", "file": "events.out.tfevents.1.x"}) + encode({"e": 0})
    (logdir / ".summaryd" / "open" / "evil.journal").write_bytes(crafted)
    daemon = start_daemon(tmp_path, logdir=logdir)
    daemons.append(daemon)
    assert (victim / "events.out.tfevents.1.x").read_bytes() == b"precious" * 100
    assert "names a run outside the logdir" in daemon.log()
    assert list((logdir / ".summaryd").glob("damaged-*-open-evil.journal"))


def test_no_run_reaches_the_state_directory_wherever_it_is(tmp_path: Path, daemons: list[Daemon]) -> None:
    """`--state-dir` inside the logdir: a run path into it is refused (INVALID_ARGUMENT), and so is a file path
    of PutFile; the daemon starts again afterwards."""
    logdir = tmp_path / "runs"
    state = logdir / "exp" / "state"
    daemon = start_daemon(tmp_path, "--state-dir", str(state), logdir=logdir)
    daemons.append(daemon)
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.SummariesStub(channel)
        for run in ("exp/state/open", "exp/state"):
            with pytest.raises(grpc.RpcError) as refused:
                stub.OpenSession(
                    pb.OpenSessionRequest(session_id=f"s-{len(run)}", run=run, next_sequence=1), timeout=10
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "state directory" in (refused.value.details() or "")
        stub.OpenSession(pb.OpenSessionRequest(session_id="ok", run="exp", next_sequence=1), timeout=10)
        with pytest.raises(grpc.RpcError) as refused:
            stub.PutFile(pb.PutFileRequest(session_id="ok", path="state/open/evil.journal", content=b"x"), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not (state / "open" / "evil.journal").exists()
    os.kill(daemon.proc.pid, signal.SIGKILL)
    daemon.proc.wait(30)
    daemons.append(start_daemon(tmp_path, "--state-dir", str(state), logdir=logdir))


@pytest.mark.parametrize("name", ["sessions", "losses", "open/x.journal"])
def test_a_state_entry_replaced_by_a_symlink_or_directory_is_kept_aside(
    tmp_path: Path, daemons: list[Daemon], name: str
) -> None:
    logdir = tmp_path / "runs"
    state = logdir / ".summaryd"
    (state / "open").mkdir(parents=True)
    (state / name).mkdir()
    daemon = start_daemon(tmp_path, logdir=logdir)
    daemons.append(daemon)
    assert "Traceback" not in daemon.log()
    assert "kept it as damaged-" in daemon.log()
    new_session_opens(daemon)


@pytest.mark.parametrize("case", ["a file", "the logdir"])
def test_an_unusable_state_dir_refuses_with_one_line(tmp_path: Path, case: str) -> None:
    logdir, state = tmp_path / "runs", tmp_path / "state"
    if case == "a file":
        state.write_text("not a directory")
    else:
        logdir.mkdir()
        state = logdir
    argv = [sys.executable, "-m", "summaryd.server", "serve", "--logdir", str(logdir), "--state-dir", str(state)]
    done = subprocess.run([*argv, "--listen", "127.0.0.1:0"], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.splitlines()
    assert ("state directory" in line or "--state-dir" in line) and str(state) in line, line


def test_a_session_last_recorded_before_a_corrupt_line_is_refused_one_recorded_after_it_resumes(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    """The corrupt line may have been A's later update (its sequence number is then too low): A is refused. B's
    latest line comes after it: B resumes where that line says. C was closed: it stays closed."""
    from summaryd.server.storage.journal import encode

    state = tmp_path / "runs" / ".summaryd"
    state.mkdir(parents=True)
    now = int(time.time())
    lines = [
        encode({"s": "A", "r": "run", "q": 50, "t": now}),
        encode({"s": "B", "r": "run", "q": 10, "t": now}),
        encode({"s": "C", "r": "run", "q": 7, "t": now, "c": 1}),
        bytearray(encode({"s": "A", "r": "run", "q": 100, "t": now})),
        encode({"s": "B", "r": "run", "q": 20, "t": now}),
    ]
    lines[3][12] ^= 0x01  # A's later update is corrupt
    (state / "sessions").write_bytes(b"".join(bytes(line) for line in lines))
    daemon = start_daemon(tmp_path)
    daemons.append(daemon)
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.SummariesStub(channel)

        def open_(session_id: str) -> int:
            request = pb.OpenSessionRequest(session_id=session_id, run="run", next_sequence=1)
            last: int = stub.OpenSession(request, timeout=10).last_sequence
            return last

        with pytest.raises(grpc.RpcError) as refused:
            open_("A")
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "cannot be resumed" in (refused.value.details() or "")
        assert open_("B") == 20
        with pytest.raises(grpc.RpcError) as closed:
            open_("C")
        assert "was closed" in (closed.value.details() or "")
        assert open_("D") == 0  # a new session (an old client: no start time, nothing acknowledged) opens
    assert "sessions has 1 corrupt line (4 good lines used)" in daemon.log()
