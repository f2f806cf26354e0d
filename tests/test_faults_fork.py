"""fork() under a live client: a torch DataLoader with forked workers, while the parent streams all along.

Each worker process logs through the writer it inherited: it gets its own session (the parent's session,
channel and threads are left alone in the child), delivers at its exit, and the parent's stream goes on
undisturbed, in order and complete.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _support import FORKING_WRITER, Daemon, assert_whole_records, event_files, read_events, run_script, start_daemon
from summaryd.client import Sender
from summaryd.client._process import _fork

# The training process: a thread logs `train/loss` without pause; each epoch forks fresh DataLoader workers
# (fork start method), whose dataset logs `loader/item` through the inherited writer.
TRAINING = textwrap.dedent(
    """
    import json, os, sys, threading, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    from summaryd.client import SummaryWriter

    epochs = int(sys.argv[1])
    writer = SummaryWriter("forked", worker="", close_timeout=30)

    class Items(Dataset):
        epoch = 0
        def __len__(self):
            return 8
        def __getitem__(self, index):
            writer.add_scalar("loader/item", index, self.epoch * 8 + index)
            return torch.tensor([index], dtype=torch.float32)

    stop, logged = threading.Event(), [0]
    def train():
        while not stop.is_set():
            writer.add_scalar("train/loss", logged[0], logged[0])
            logged[0] += 1
            time.sleep(0.0005)
    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    items = Items()
    try:
        for epoch in range(epochs):
            items.epoch = epoch
            loader = DataLoader(items, batch_size=2, num_workers=2, multiprocessing_context="fork")
            assert sorted(int(x) for batch in loader for x in batch.flatten()) == list(range(8))
    finally:
        stop.set()
        trainer.join()
    report = writer.close()
    print(json.dumps({"pid": os.getpid(), "logged": logged[0], "ok": report.ok, "synced": report.synced,
                      "delivered": report.delivered, "tensorflow": "tensorflow" in sys.modules}))
    """
)


def run_training(daemon: Daemon, tmp_path: Path, epochs: int, **env: str) -> dict[str, int]:
    """One training process, bounded by a timeout (a hang fails the test instead of stalling it)."""
    environ = {**os.environ, "SUMMARYD_ADDRESS": daemon.address, "SUMMARYD_SPOOL_DIR": str(tmp_path / "spool"), **env}
    done = subprocess.run(
        [sys.executable, "-c", TRAINING, str(epochs)],
        env=environ,
        check=False,
        capture_output=True,
        text=True,
        timeout=60 + 10 * epochs,
    )
    assert done.returncode == 0, "\n".join(line for line in done.stderr.splitlines() if "fork_posix" not in line)
    report: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["synced"], report
    # Installed (the slow tier), TensorFlow's threads would be forked into every worker: summaryd imports none.
    assert not report.pop("tensorflow"), "summaryd imported TensorFlow into a torch training process"
    return report


def check_run(daemon: Daemon, parents: list[dict[str, int]], epochs: int) -> None:
    """Every parent's `train/loss` once and in order; each worker's items once; a session per worker."""
    train: dict[float, list[int]] = collections.defaultdict(list)
    items: collections.Counter[int] = collections.Counter()
    for path in event_files(daemon.logdir / "forked"):
        assert_whole_records(path)
        for event in read_events(path):
            for value in event.summary.value:
                if value.tag == "train/loss":
                    train[event.wall_time > 0].append(event.step)
                else:
                    items[event.step] += 1
    assert sum(len(steps) for steps in train.values()) == sum(p["logged"] for p in parents)
    # A parent's close() reports its workers' items too (each epoch's workers exited before it), but for those of
    # workers forked before its first connection, which used gRPC themselves.
    logged = sum(p["logged"] for p in parents)
    assert logged <= sum(p["delivered"] for p in parents) <= logged + epochs * 8 * len(parents)
    assert sorted(items) == list(range(epochs * 8)) and set(items.values()) == {len(parents)}
    log = daemon.log()
    parent_pids = {p["pid"] for p in parents}
    opened = re.findall(r"session (\S+) opened: run forked at sequence 0, client \S+ pid (\d+)", log)
    children = [sid for sid, pid in opened if int(pid) not in parent_pids]
    assert len([sid for sid, pid in opened if int(pid) in parent_pids]) == len(parents), "a parent changed session"
    assert len(children) == 2 * epochs * len(parents), "each forked worker logs in a session of its own"
    closed = set(re.findall(r"session (\S+) closed: run forked", log))
    assert set(children) <= closed, "a worker exited without closing its session"


def test_dataloader_workers_forked_20_times_under_a_live_stream(daemon: Daemon, tmp_path: Path) -> None:
    """20 epochs, each forking two fresh workers while the parent's stream is busy: no hang, nothing lost."""
    report = run_training(daemon, tmp_path, epochs=20)
    check_run(daemon, [report], epochs=20)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fork_20_processes_in_a_row(daemon: Daemon, tmp_path: Path) -> None:
    """The same as 20 fresh training processes in a row, which fork while their first connection is young."""
    reports = [run_training(daemon, tmp_path, epochs=2) for _ in range(20)]
    check_run(daemon, reports, epochs=2)


# A client process forks while a thread of it is inside a gRPC call (a channel connecting to a port where nothing
# listens): with GRPC_TRACE=fork, gRPC core logs from fork_posix.cc whenever its own fork handlers are installed.
FORK_INSIDE_GRPC = textwrap.dedent(
    """
    import os
    import summaryd.client
    import grpc

    channel = grpc.insecure_channel("127.0.0.1:1")
    ready = grpc.channel_ready_future(channel)
    try:
        ready.result(timeout=0.3)
    except grpc.FutureTimeoutError:
        pass
    pid = os.fork()
    if pid == 0:
        os._exit(3 if "GRPC_ENABLE_FORK_SUPPORT" in os.environ else 0)
    _, status = os.waitpid(pid, 0)
    ready.cancel()
    channel.close()
    print(os.waitstatus_to_exitcode(status))
    """
)


def test_grpc_core_fork_handlers_stay_off() -> None:
    """gRPC core reads GRPC_ENABLE_FORK_SUPPORT at its first initialisation, not at import: the client has it
    read while the variable is set, so core's fork handlers (which restart gRPC's threads in a DataLoader
    worker, where they abort it) never run, and the variable is gone again for the process and its children."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    done = run_script(FORK_INSIDE_GRPC, [], {**environ, "GRPC_TRACE": "fork", "GRPC_VERBOSITY": "debug"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"], "the child saw GRPC_ENABLE_FORK_SUPPORT in its environment"
    assert "fork_posix" not in done.stderr, done.stderr


def test_grpc_fork_support_draws_a_warning(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """gRPC's own fork support deadlocks children of a streaming client; a fork with it on says so, once."""
    sender = Sender("warned", address="127.0.0.1:1")
    monkeypatch.setenv("GRPC_ENABLE_FORK_SUPPORT", "true")
    monkeypatch.setattr(_fork, "_warned_fork_support", False)
    # No real fork happens: the parent's side must not start a courier (its thread would outlive the test).
    monkeypatch.setattr(_fork, "_grpc_pid", None)
    with caplog.at_level(logging.WARNING, logger="summaryd.client"):
        for _ in range(2):
            _fork._before_fork()
            _fork._after_fork_in_parent()
    assert sum("unset GRPC_ENABLE_FORK_SUPPORT" in r.getMessage() for r in caplog.records) == 1
    sender.close(timeout=0)


def test_courier_delivers_a_childs_outbox_with_the_writers_own_token(tmp_path: Path) -> None:
    """The token given to SummaryWriter reaches the courier: no SUMMARYD_TOKEN, and the child's step arrives."""
    token = "fork-token-0123456789abcdef"
    (tmp_path / "tokens").write_text(f"{token} *\n")
    daemon = start_daemon(tmp_path, "--token-file", str(tmp_path / "tokens"))
    try:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("SUMMARYD_")}
        environ["SUMMARYD_SPOOL_DIR"] = str(tmp_path / "spool")
        done = run_script(FORKING_WRITER, ["tokened", json.dumps({"address": daemon.address, "token": token})], environ)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.strip().splitlines()[-1])["ok"], done.stdout
        tags = [
            v.tag for path in event_files(daemon.logdir / "tokened") for e in read_events(path) for v in e.summary.value
        ]
        assert sorted(tags) == ["child", "parent"], done.stderr
    finally:
        daemon.terminate()


# A parent that logged once (so its children may not use gRPC) forks children that log through the writer they
# inherited, waits for them, closes the writer and at once counts what is in the run's file.
CHILDREN_THEN_CLOSE = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from summaryd.client import SummaryWriter
    sys.path.insert(0, sys.argv[2])
    from _support import event_files, read_events

    writer = SummaryWriter("children", worker="", close_timeout=30)
    writer.add_scalar("parent", 1.0, 0)
    assert writer.flush(timeout=30).delivered == 1
    children = []
    for index in range(4):
        pid = os.fork()
        if pid == 0:
            for step in range(100):
                writer.add_scalar("child", float(index), index * 100 + step)
            writer.close()
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    report = writer.close()
    in_file = sum(
        v.tag == "child" for path in event_files(Path(sys.argv[1]) / "children") for e in read_events(path)
        for v in e.summary.value
    )
    spool_root = Path(os.environ["SUMMARYD_SPOOL_DIR"])
    spool = sorted(str(p.relative_to(spool_root)) for p in spool_root.rglob("*"))
    print(json.dumps({"in_file": in_file, "delivered": report.delivered, "ok": report.ok, "spool": spool}))
    """
)


def test_close_waits_for_and_reports_what_forked_children_logged(daemon: Daemon, tmp_path: Path) -> None:
    """The writer's `close()` in the parent returns once the children's events (they have exited) are in the
    file, counts them in its report, and leaves no empty outbox directory behind."""
    environ = {**os.environ, "SUMMARYD_ADDRESS": daemon.address, "SUMMARYD_SPOOL_DIR": str(tmp_path / "spool")}
    done = run_script(CHILDREN_THEN_CLOSE, [str(daemon.logdir), str(Path(__file__).parent)], environ)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"in_file": 400, "delivered": 401, "ok": True, "spool": []}, done.stderr


# The same, but the daemon is gone by the time the parent closes: its report counts the children's events as
# undelivered, and their outbox stays for `summaryd replay`.
CHILDREN_THEN_DAEMON_GONE = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from summaryd.client import SummaryWriter

    writer = SummaryWriter("children", worker="", close_timeout=30)
    writer.add_scalar("parent", 1.0, 0)
    assert writer.flush(timeout=30).delivered == 1
    pid = os.fork()
    if pid == 0:
        os.kill(int(sys.argv[1]), 9)  # the daemon goes before the child logs
        for step in range(50):
            writer.add_scalar("child", 1.0, step)
        writer.close()
        os._exit(0)
    os.waitpid(pid, 0)
    report = writer.close(timeout=1)
    spool_root = Path(os.environ["SUMMARYD_SPOOL_DIR"])
    outboxes = [str(p.parent.parent.name) for p in spool_root.glob("children-of-*/*/manifest.json")]
    print(json.dumps({"delivered": report.delivered, "undelivered": report.undelivered, "outboxes": outboxes}))
    os._exit(0)  # not the exit's own delivery attempt, which would wait for the daemon again
    """
)


def test_close_says_what_forked_children_logged_that_it_could_not_deliver(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path)
    try:
        environ = {**os.environ, "SUMMARYD_ADDRESS": daemon.address, "SUMMARYD_SPOOL_DIR": str(tmp_path / "spool")}
        done = run_script(CHILDREN_THEN_DAEMON_GONE, [str(daemon.proc.pid)], environ)
    finally:
        daemon.terminate()
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["delivered"] == 1 and seen["undelivered"] == 50, done.stderr
    assert len(seen["outboxes"]) == 1 and seen["outboxes"][0].startswith("children-of-")
    assert "50 events forked children logged were not delivered yet" in done.stderr
