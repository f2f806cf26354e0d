"""What a new user meets, run as they run it (`python -m summaryd.server ...`): every failure is one clear line
on stderr, with no traceback, exit code 1 (2 for a usage error), and nothing created on disk."""

from __future__ import annotations

import importlib.metadata
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from _support import Daemon, cli, one_line

# Every key of `summaryd status --json`, always present (README: "summaryd status --json").
STATUS_KEYS = {"address", "logdir", "version", "runs", "sessions", "watching", "findings", "changes", "changes_through"}
RUN_KEYS = {
    "run_dir",
    "event_file",
    "events_written",
    "bytes_written",
    "sessions",
    # A bucket logdir's: zero, empty or null on a local one.
    "lease_holder",
    "staged_bytes",
    "last_upload_unix",
    "last_upload_age_seconds",
}
SESSION_KEYS = {
    "session_id",
    "run_dir",
    "worker",
    "client",
    "acked_sequence",
    "events_written",
    "duplicates_dropped",
    "idle_seconds",
    "streaming",
    # Cross-worker aggregation's: false and 0 for a session not aggregated.
    "aggregated",
    "lag_steps",
}
CLIENT_KEYS = {"host", "pid", "framework", "version"}


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_logdir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    line = one_line(cli("serve", "--logdir", str(tmp_path / "file"), "--listen", "127.0.0.1:0"), 1)
    assert "--logdir" in line and "is a file" in line


def test_a_logdir_below_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    line = one_line(cli("serve", "--logdir", str(tmp_path / "file" / "runs"), "--listen", "127.0.0.1:0"), 1)
    assert "cannot create --logdir" in line and "Not a directory" in line


def test_a_logdir_this_user_cannot_write() -> None:
    """sysfs refuses every new directory, even root's: a real unwritable place on any Linux machine."""
    line = one_line(cli("serve", "--logdir", "/sys/summaryd-runs", "--listen", "127.0.0.1:0"), 1)
    assert "cannot create --logdir /sys/summaryd-runs" in line


def test_a_state_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("")
    result = cli(
        "serve", "--logdir", str(tmp_path / "runs"), "--state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0"
    )
    assert "--state-dir" in one_line(result, 1) and "is a file" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_a_port_in_use_creates_nothing(tmp_path: Path, taken_port: int) -> None:
    """One line with the OS's reason (no line of gRPC's own before it), and neither logdir nor state made."""
    result = cli("serve", "--logdir", str(tmp_path / "runs"), "--listen", f"127.0.0.1:{taken_port}")
    line = one_line(result, 1)
    assert f"cannot listen on 127.0.0.1:{taken_port}: Address already in use" in line and "--listen" in line
    assert not (tmp_path / "runs").exists()


def test_a_metrics_port_in_use_creates_nothing(tmp_path: Path, taken_port: int) -> None:
    result = cli(
        "serve",
        "--logdir",
        str(tmp_path / "runs"),
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        f"127.0.0.1:{taken_port}",
    )
    assert "--metrics-listen" in one_line(result, 1)
    assert not (tmp_path / "runs").exists()


def test_a_missing_token_file(tmp_path: Path) -> None:
    result = cli(
        "serve", "--logdir", str(tmp_path / "runs"), "--listen", "127.0.0.1:0", "--token-file", str(tmp_path / "nope")
    )
    assert "--token-file" in one_line(result, 2)  # checked with the other settings: a usage error
    assert not (tmp_path / "runs").exists()


def test_tls_files_that_cannot_be_used(tmp_path: Path) -> None:
    """A certificate that is not PEM, and one that is missing: one line each naming the flags, nothing made."""
    (tmp_path / "garbage.pem").write_text("garbage\n")
    for cert, says in (("garbage.pem", "gRPC refused the certificate or key"), ("missing.pem", "missing.pem")):
        tls = ["--tls-cert", str(tmp_path / cert), "--tls-key", str(tmp_path / cert)]
        line = one_line(cli("serve", "--logdir", str(tmp_path / "runs"), "--listen", "127.0.0.1:0", *tls), 1)
        assert says in line and "--tls-cert" in line
    assert not (tmp_path / "runs").exists()


def test_an_unknown_log_level_is_a_usage_error(tmp_path: Path) -> None:
    line = one_line(cli("serve", "--logdir", str(tmp_path / "runs"), "--log-level", "verbose"), 2)
    assert "--log-level 'verbose'" in line and "debug" in line
    assert not (tmp_path / "runs").exists()


def test_a_misspelled_serve_flag_is_serves_error() -> None:
    line = one_line(cli("serve", "--logdri", "x"), 2)
    assert line.startswith("summaryd serve: error: unrecognized arguments: --logdri")
    assert "did you mean --logdir?" in line and "summaryd serve --help" in line


def test_version() -> None:
    result = cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"summaryd {importlib.metadata.version('summaryd')}"


def test_status_of_no_daemon_is_one_line_as_health_is() -> None:
    for command in ("status", "health"):
        line = one_line(cli(command, "--address", "127.0.0.1:1", "--timeout", "2"), 1)
        assert line.startswith("summaryd at 127.0.0.1:1: UNAVAILABLE")


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("http://localhost:6065", "is a URL"),
        ("localhost:99999", "1 to 65535"),
        ("localhost:port", "1 to 65535"),
        (":6065", "names no host"),
    ],
)
def test_status_refuses_an_address_it_cannot_dial(address: str, says: str) -> None:
    line = one_line(cli("status", "--address", address), 2)
    assert says in line and "summaryd status" in line


def test_status_reads_a_bad_summaryd_address_in_one_line() -> None:
    line = one_line(cli("health", env={"SUMMARYD_ADDRESS": "https://daemon:6065"}), 2)
    assert "SUMMARYD_ADDRESS" in line and "is a URL" in line


def test_status_json_has_every_key_with_numbers(daemon: Daemon) -> None:
    """Empty lists and zero counts are present; 64-bit integers are JSON numbers."""
    from summaryd.client import SummaryWriter

    empty = json.loads(cli("status", "--json", "--address", daemon.address).stdout)
    assert set(empty) == STATUS_KEYS and (empty["runs"], empty["sessions"]) == ([], [])
    with SummaryWriter("watched", address=daemon.address, worker="") as writer:
        writer.add_scalar("x", 1.0, 1)
        assert writer.flush(timeout=10).delivered == 1
        result = cli("status", "--json", "--address", daemon.address)
    status = json.loads(result.stdout)
    assert set(status) == STATUS_KEYS
    [run] = status["runs"]
    [session] = status["sessions"]
    assert set(run) == RUN_KEYS and set(session) == SESSION_KEYS and set(session["client"]) == CLIENT_KEYS
    assert (run["events_written"], session["events_written"], session["duplicates_dropped"]) == (1, 1, 0)
    assert session["client"]["pid"] == os.getpid() and session["worker"] == ""


def test_plain_status_counts_open_runs(daemon: Daemon) -> None:
    """A finished run is on disk but not open: status says 'open runs', not 'runs'."""
    from summaryd.client import SummaryWriter

    with SummaryWriter("finished", address=daemon.address, worker="") as writer:
        writer.add_scalar("x", 1.0, 1)
    assert (daemon.logdir / "finished").is_dir()
    result = cli("status", "--address", daemon.address)
    assert result.returncode == 0, result.stderr
    assert "0 open runs" in result.stdout and "finished runs stay in the logdir" in result.stdout
