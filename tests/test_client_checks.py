"""The client refuses at construction what can never work (a run path the daemon refuses, an address it cannot
dial), and its reports and messages say what happened: an error that was overcome is not the report's error, and
the spool is announced, delivered and removed in so many words."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from _support import event_files, leave_a_spool, read_events, start_daemon, unused_port, wait_for
from summaryd.client import Sender, SummaryWriter
from summaryd.client._environment import parse_address
from summaryd.client.hooks import PlainStepCounterHook, PlainSummarySaverHook

BAD_RUNS = [
    ("../../etc", "'..'"),
    ("/abs/run", "is absolute"),
    (".summaryd/x", "keeps its state"),
    ("exp/./run", "'.'"),
    ("exp//run", "empty"),
    ("exp\nrun", "U+000A"),
    ("exp\x00run", "U+0000"),
    ("exp\\run", "backslash"),
    ("e\u0301xp", "NFC"),
]


def scalar(step: int) -> bytes:
    return Event(
        step=step, summary=Summary(value=[Summary.Value(tag="x", simple_value=float(step))])
    ).SerializeToString()


@pytest.mark.parametrize(("run", "says"), BAD_RUNS)
def test_writer_refuses_a_run_path_the_daemon_refuses(run: str, says: str) -> None:
    """As torch raises when it cannot make its directory: at once, not by dropping every event later."""
    with pytest.raises(ValueError, match="run path") as refused:
        SummaryWriter(run, address=f"127.0.0.1:{unused_port()}", worker="")
    assert says in str(refused.value)


def test_writer_refuses_a_worker_label_the_daemon_refuses() -> None:
    with pytest.raises(ValueError, match="worker label 'a/b'"):
        SummaryWriter("exp", address=f"127.0.0.1:{unused_port()}", worker="a/b")


def test_the_daemon_applies_the_same_rules(tmp_path: Path) -> None:
    """One set of rules: what the client refuses, the daemon refuses with the same words."""
    from summaryd.server.storage.runpath import run_dir_parts
    from summaryd.v1 import runpath

    assert run_dir_parts is runpath.run_dir_parts
    for run, says in BAD_RUNS:
        with pytest.raises(runpath.RunPathError) as refused:
            run_dir_parts(run)
        assert says in str(refused.value)


@pytest.mark.parametrize("hook", ["saver", "counter"])
@pytest.mark.parametrize(("run", "says"), BAD_RUNS[:3])
def test_hooks_refuse_an_output_dir_the_daemon_refuses(hook: str, run: str, says: str) -> None:
    with pytest.raises(ValueError, match="run path") as refused:
        if hook == "saver":
            PlainSummarySaverHook(save_steps=1, output_dir=run, summary_op=lambda: {"loss": 0.5})
        else:
            PlainStepCounterHook(every_n_steps=1, output_dir=run)
    assert says in str(refused.value)


COMPLETED = {
    "localhost": "localhost:6065",
    "[::1]": "[::1]:6065",
    "::1": "[::1]:6065",
    " localhost:7000 ": "localhost:7000",
    "daemon.example:7000": "daemon.example:7000",
    "[::1]:7000": "[::1]:7000",
    "unix:/run/summaryd.sock": "unix:/run/summaryd.sock",
}


def test_addresses_are_completed() -> None:
    """A host alone dials the documented port 6065 (gRPC's own default would be 443); the rest stay as given."""
    assert {address: parse_address(address) for address in COMPLETED} == COMPLETED
    assert {address: Sender("r", address=address).address for address in COMPLETED} == COMPLETED


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("localhost:99999", "1 to 65535"),
        ("localhost:0", "1 to 65535"),
        ("localhost:http", "1 to 65535"),
        ("http://localhost:6065", "is a URL"),
        ("grpc://localhost:6065", "is a URL"),
        (":6065", "names no host"),
        ("[::1", "brackets"),
        ("[nonsense]:6065", "not an IPv6 address"),
        ("local host:6065", "not a daemon address"),
    ],
)
def test_addresses_that_cannot_be_dialed_are_refused(address: str, says: str) -> None:
    with pytest.raises(ValueError, match="address") as refused:
        SummaryWriter("exp", address=address, worker="")
    assert says in str(refused.value)


def test_a_bad_summaryd_address_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUMMARYD_ADDRESS", "http://daemon:6065")
    with pytest.raises(ValueError, match="SUMMARYD_ADDRESS: address 'http://daemon:6065' is a URL"):
        SummaryWriter("exp", worker="")


def test_a_daemon_that_comes_up_late_leaves_no_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The daemon was away when logging began and came up later: everything delivered, no error in the reports,
    no message about a spool (none was made), and one saying the daemon is back."""
    port = unused_port()
    with caplog.at_level(logging.INFO, logger="summaryd.client"):
        sender = Sender("late", address=f"127.0.0.1:{port}", spool_dir=tmp_path / "spool", spool_after=600)
        for step in range(10):
            sender.submit(scalar(step), 40)
        wait_for(lambda: sender.unreachable, 30, "the first connection attempt to fail")
        daemon = start_daemon(tmp_path, "--listen", f"127.0.0.1:{port}")
        try:
            flushed = sender.flush(timeout=30)
            report = sender.close(timeout=30)
        finally:
            daemon.terminate()
    assert flushed.ok and flushed.delivered == 10 and flushed.error is None, flushed.error
    assert report.ok and report.delivered == 10 and report.synced and report.error is None, report.error
    messages = [r.getMessage() for r in caplog.records]
    assert not any("spooling" in m or "not delivered" in m for m in messages), messages
    away = [m for m in messages if f"no daemon answers at 127.0.0.1:{port}" in m]
    assert away and "is `summaryd serve` running there?" in away[0] and "keeps its events in memory" in away[0]
    assert any(f"daemon at 127.0.0.1:{port} answers again for run 'late'" in m for m in messages), messages


def test_spooled_events_delivered_later_are_said_to_be(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Told that events were spooled, the user is also told when the daemon took them and the spool is gone."""
    port, spool_root = unused_port(), tmp_path / "spool"
    with caplog.at_level(logging.WARNING, logger="summaryd.client"):
        sender = Sender("later", address=f"127.0.0.1:{port}", spool_dir=spool_root, spool_after=0.2)
        for step in range(10):
            sender.submit(scalar(step), 40)
        wait_for(lambda: sender.report().spooled == 10, 30, "the events to be spooled")
        daemon = start_daemon(tmp_path, "--listen", f"127.0.0.1:{port}")
        try:
            report = sender.close(timeout=30)
        finally:
            daemon.terminate()
    assert report.ok and report.error is None and report.spooled == 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("spooling events of run 'later'" in m for m in messages), messages
    assert any("answers again for run 'later'; sending the 10 spooled events" in m for m in messages), messages
    assert any("acknowledged every spooled event of run 'later'; removed the spool" in m for m in messages), messages
    assert list(spool_root.iterdir()) == []


def _replay_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "SUMMARYD_ADDRESS"}
    return subprocess.run(
        [sys.executable, "-m", "summaryd.server", "replay", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_replay_takes_summaryd_address_and_removes_what_it_delivered(tmp_path: Path) -> None:
    """The spool records a daemon that is gone; SUMMARYD_ADDRESS names the one to use, and replay says so."""
    spool_root = tmp_path / "spool"
    spool = leave_a_spool(spool_root, unused_port())
    daemon = start_daemon(tmp_path)
    try:
        result = _replay_cli(str(spool_root), env={"SUMMARYD_ADDRESS": daemon.address})
    finally:
        daemon.terminate()
    assert result.returncode == 0, result.stdout + result.stderr
    line = result.stdout.strip()
    assert f"delivered 3 events of run 'left' to {daemon.address} (SUMMARYD_ADDRESS)" in line
    assert line.endswith("spool removed")
    assert not spool.exists() and list(spool_root.iterdir()) == []


def test_replay_moves_on_from_a_daemon_that_is_away_to_the_next_of_summaryd_address(tmp_path: Path) -> None:
    spool_root = tmp_path / "spool"
    spool = leave_a_spool(spool_root, unused_port())
    daemon = start_daemon(tmp_path)
    try:
        away = f"127.0.0.1:{unused_port()}"
        result = _replay_cli(str(spool_root), env={"SUMMARYD_ADDRESS": f"{away},{daemon.address}"})
    finally:
        daemon.terminate()
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"delivered 3 events of run 'left' to {daemon.address} (SUMMARYD_ADDRESS)" in result.stdout
    assert not spool.exists()
    assert [e.step for e in read_events(event_files(daemon.logdir / "left")[0]) if e.HasField("summary")] == [0, 1, 2]


def test_replay_says_it_used_the_recorded_address_and_keep_keeps(tmp_path: Path) -> None:
    spool_root, port = tmp_path / "spool", unused_port()
    spool = leave_a_spool(spool_root, port)
    daemon = start_daemon(tmp_path, "--listen", f"127.0.0.1:{port}")
    try:
        result = _replay_cli(str(spool), "--keep", env={})
    finally:
        daemon.terminate()
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"to 127.0.0.1:{port} (recorded in the spool)" in result.stdout
    assert result.stdout.strip().endswith("spool kept") and spool.is_dir()


def test_replay_refuses_a_bad_address_in_one_line(tmp_path: Path) -> None:
    result = _replay_cli(str(tmp_path), "--address", "http://localhost:6065", env={})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line] == [
        "summaryd replay: error: address 'http://localhost:6065' is a URL; give HOST:PORT (e.g. localhost:6065), "
        "HOST alone (port 6065), [IPv6]:PORT or unix:/PATH (see 'summaryd replay --help')"
    ]


def test_replay_refuses_tls_settings_that_do_not_go_together(tmp_path: Path) -> None:
    """A certificate without its key is the settings' fault, not the spool's: one usage line, nothing replayed."""
    spool_root = tmp_path / "spool"
    spool = leave_a_spool(spool_root, unused_port())
    result = _replay_cli(str(spool_root), env={"SUMMARYD_TLS_CERT": str(tmp_path / "client.pem")})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line]
    assert line.startswith("summaryd replay: error: a client certificate needs both")
    assert spool.is_dir()
