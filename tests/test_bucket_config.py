"""Settings of a bucket logdir: where its state and staging go, and the URLs and seal flags refused at once.

No object store is needed: these run in the default tier (the objstore tier runs the daemon on a real one).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from summaryd.cli import build_parser, config_from, main
from summaryd.server.config import Config
from summaryd.server.storage.bucket.segments import SealPolicy
from summaryd.server.storage.bucket.store import is_bucket_url, split_url


def test_a_local_logdir_keeps_its_state_beside_it(tmp_path: Path) -> None:
    config = Config(logdir=str(tmp_path / "runs"))
    assert not config.is_bucket
    assert config.local_logdir == str(tmp_path / "runs")
    assert config.state_path == str(tmp_path / "runs" / ".summaryd")


def test_a_bucket_logdir_stages_under_a_local_state_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    config = Config.from_options(logdir="s3://bucket/team/exp", seal_secs=2, seal_bytes=1000, seal_max_secs=60)
    assert config.is_bucket
    assert config.state_path == str(tmp_path / "xdg" / "summaryd" / "s3" / "bucket" / "team" / "exp")
    assert config.local_logdir == str(tmp_path / "xdg" / "summaryd" / "s3" / "bucket" / "team" / "exp" / "staging")
    assert config.bucket.seal == SealPolicy(seal_secs=2, seal_bytes=1000, seal_max_secs=60)
    explicit = Config.from_options(
        logdir="gs://bucket", state_dir=str(tmp_path / "s"), staging_dir=str(tmp_path / "st")
    )
    assert (explicit.state_path, explicit.local_logdir) == (str(tmp_path / "s"), str(tmp_path / "st"))


def test_bucket_urls_are_recognised_and_split() -> None:
    assert [is_bucket_url(u) for u in ("s3://b/p", "gs://b", "az://acct/c", "./runs", "/srv/s3://x", "ftp://b")] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    assert split_url("s3://bucket/a/b/") == ("s3", "bucket", "a/b")
    assert split_url("s3://bucket") == ("s3", "bucket", "")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--logdir", "s3://"], "s3://BUCKET/PREFIX"),
        (["--logdir", "s3://bucket/a//b"], "empty, '.' or '..'"),
        (["--logdir", "s3://bucket/../b"], "empty, '.' or '..'"),
        (["--logdir", "s3://bucket/p", "--seal-secs", "0"], "--seal-secs"),
        (["--logdir", "s3://bucket/p", "--seal-bytes", "-1"], "--seal-bytes"),
    ],
)
def test_bad_bucket_settings_are_one_usage_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err, err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--logdir", "s3://bucket/p", "--advertise", "node-3"], "--advertise 'node-3' needs HOST:PORT"),
        (["--logdir", "s3://bucket/p", "--advertise", "node-3:http"], "--advertise 'node-3:http' needs HOST:PORT"),
        (["--logdir", "s3://bucket/p", "--run-lease", "0"], "--run-lease must be positive"),
    ],
)
def test_bad_run_ownership_settings_are_one_usage_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err, err


def test_the_advertised_address_comes_from_the_environment_too() -> None:
    parser, _ = build_parser()
    args = parser.parse_args(["serve", "--logdir", "s3://bucket/p"])
    assert config_from(args, {"SUMMARYD_ADVERTISE": "node-3.example:6065"}).bucket.advertise == "node-3.example:6065"
    assert config_from(args, {}).bucket.advertise == ""  # the daemon advertises its --listen address


@pytest.mark.parametrize("listen", ["0.0.0.0:6065", "[::]:6065"])
def test_a_daemon_listening_everywhere_advertises_its_host_name_not_the_wildcard(listen: str) -> None:
    config = Config(logdir="s3://bucket/p", insecure=True, listen=listen)
    advertised = config.advertised(41234)  # the port bound (--listen may say 0)
    host = socket.getfqdn() or socket.gethostname()
    assert advertised in (f"{host}:41234", f"[{host}]:41234")
    assert not advertised.startswith(("0.0.0.0", "[::]", "::"))


def test_the_advertised_address_is_the_listen_host_or_the_flag() -> None:
    assert Config(logdir="s3://bucket/p", insecure=True, listen="10.0.0.7:0").advertised(6066) == "10.0.0.7:6066"
    assert Config(logdir="s3://bucket/p", insecure=True, listen="[::1]:0").advertised(6066) == "[::1]:6066"
    given = Config.from_options(
        logdir="s3://bucket/p", insecure=True, listen="0.0.0.0:6065", advertise="node-3.example:6065"
    )
    assert given.advertised(6065) == "node-3.example:6065"


def test_the_help_says_what_is_advertised_when_listening_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "0.0.0.0 or [::]" in " ".join(capsys.readouterr().out.split())
