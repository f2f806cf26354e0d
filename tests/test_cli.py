"""The command line: flags and SUMMARYD_* variables map onto one Config; --help explains both."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _support import Daemon, wait_healthy
from summaryd.cli import config_from, main
from summaryd.server.config import Config


def _args(**flags: object) -> argparse.Namespace:
    return argparse.Namespace(**flags)


def test_defaults() -> None:
    config = config_from(_args(), {})
    assert config == Config()
    assert (config.logdir, config.listen) == ("./runs", "127.0.0.1:6065")


def test_environment_then_flags() -> None:
    """SUMMARYD_* variables override defaults; flags override variables; values are typed."""
    env = {"SUMMARYD_LOGDIR": "/data/tb", "SUMMARYD_LISTEN": "127.0.0.1:7000", "SUMMARYD_SHUTDOWN_TIMEOUT": "3.5"}
    config = config_from(_args(listen="127.0.0.1:7001"), env)
    assert (config.logdir, config.listen, config.shutdown_timeout) == ("/data/tb", "127.0.0.1:7001", 3.5)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SUMMARYD_IO_THREADS": "many"}, "SUMMARYD_IO_THREADS='many' is not a valid int"),
        ({"SUMMARYD_LISTEN": "nohost"}, "needs HOST:PORT"),
        ({"SUMMARYD_LISTEN": "127.0.0.1:99999"}, "0..65535"),
    ],
)
def test_bad_values_say_what_to_fix(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_from(_args(), env)


def test_help_names_every_flag_and_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for name in ("logdir", "listen", "shutdown-timeout", "max-message-bytes", "io-threads", "log-level"):
        assert f"--{name}" in text
        assert "SUMMARYD_" + name.upper().replace("-", "_") in text


def test_bad_flag_value_exits_2_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--listen", "localhost"])
    assert exited.value.code == 2
    assert "needs HOST:PORT" in capsys.readouterr().err


def test_daemon_configured_by_environment_alone(tmp_path: Path) -> None:
    """`summaryd serve` with only SUMMARYD_* variables serves on that logdir; `summaryd health` says so."""
    env = {
        **os.environ,
        "SUMMARYD_LOGDIR": str(tmp_path / "envlogs"),
        "SUMMARYD_LISTEN": "127.0.0.1:0",
        "SUMMARYD_PORT_FILE": str(tmp_path / "port"),
    }
    log_path = tmp_path / "daemon.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "summaryd.server", "serve"], env=env, stderr=log)
    try:
        port_file = tmp_path / "port"
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, log_path.read_text()
            time.sleep(0.02)
        address = f"127.0.0.1:{int(port_file.read_text())}"
        wait_healthy(address)
        health = subprocess.run(
            [sys.executable, "-m", "summaryd.server", "health", "--address", address],
            capture_output=True,
            text=True,
            check=False,
        )
        assert health.returncode == 0 and "SERVING" in health.stdout
        assert (tmp_path / "envlogs").is_dir()
    finally:
        Daemon(proc, tmp_path, 0, log_path).terminate()
    assert proc.returncode == 0


def test_health_of_nothing_fails(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "summaryd.server", "health", "--address", "127.0.0.1:1", "--timeout", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1 and "UNAVAILABLE" in result.stderr


def test_a_port_in_use_is_a_clear_error(daemon: Daemon, tmp_path: Path) -> None:
    """A second daemon on a taken port says so and exits 1, without a traceback."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "summaryd.server",
            "serve",
            "--logdir",
            str(tmp_path / "other"),
            "--listen",
            daemon.address,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "cannot listen on" in result.stderr and "--listen" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["serve", "--port", "6006"], "did you mean --listen HOST:PORT?"),
        (["status", "--host", "localhost"], "did you mean --address HOST:PORT?"),
        (["serve", "--logd", "runs"], "did you mean --logdir?"),
        (["serve", "--max-batch", "4"], "did you mean --max-batch-events?"),
    ],
    ids=["tensorboard-port", "uvicorn-host", "abbreviated", "abbreviated-ambiguous"],
)
def test_a_flag_counts_only_by_its_whole_name(
    argv: list[str], hint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """TensorBoard's `--port 6006` was taken for `--port-file 6006` (argparse's abbreviations): the daemon served
    on its default port and wrote a file named 6006. A flag not named whole is a one-line usage error now, with
    the flag meant, and nothing is started or written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unrecognized arguments" in err and hint in err, err
    assert list(tmp_path.iterdir()) == []
