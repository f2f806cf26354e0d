"""A client given several daemons: the address list, and moving to the next daemon when one is gone.

Real daemons on a local logdir; the daemon that is gone is a loopback port nobody listens on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _support import Daemon, log_losses, start_daemon, steps_in, unused_port
from summaryd.client import SummaryWriter
from summaryd.client._options import ClientOptions
from summaryd.client._sender._targets import DaemonTargets


def test_an_address_list_is_parsed_from_the_argument_and_the_environment() -> None:
    made = ClientOptions.make(address="a:6000, b ,a:6000", environ={})
    assert made.addresses == ("a:6000", "b:6065")  # completed, repeats dropped, order kept
    from_env = ClientOptions.make(environ={"SUMMARYD_ADDRESS": "[::1]:7000,c:7001"})
    assert from_env.addresses == ("[::1]:7000", "c:7001") and from_env.address == "[::1]:7000"
    with pytest.raises(ValueError, match="SUMMARYD_ADDRESS: address 'http://x:1' is a URL"):
        ClientOptions.make(environ={"SUMMARYD_ADDRESS": "a:1,http://x:1"})
    with pytest.raises(ValueError, match="names no daemon"):
        ClientOptions.make(address=" , ", environ={})


def test_targets_go_round_the_list_and_follow_a_redirect() -> None:
    targets = DaemonTargets(("a:1", "b:1"), redirect_allow=("owner:1",))
    assert targets.current == "a:1"
    assert targets.move_on() and targets.current == "b:1"
    assert targets.redirect("owner:1") and targets.current == "owner:1"
    assert not targets.redirect("owner:1")
    assert targets.move_on() and targets.current == "a:1"  # the owner gone too: the list again
    assert not DaemonTargets(("a:1",)).move_on()  # one daemon: nowhere else to go


def test_a_daemon_that_is_gone_is_passed_over_for_the_next(tmp_path: Path, daemon: Daemon) -> None:
    gone = f"127.0.0.1:{unused_port()}"
    with SummaryWriter("over", address=f"{gone},{daemon.address}", backoff_secs=(0.05, 0.2)) as writer:
        log_losses(writer, range(50))
    assert steps_in(daemon.logdir / "over") == list(range(50))


def test_a_session_moves_to_the_next_daemon_when_its_daemon_dies(tmp_path: Path, daemons: list[Daemon]) -> None:
    # Both daemons on one local logdir, one after the other: the session resumes on the second with the
    # numbering it had (what the first acknowledged is not sent again).
    logdir = tmp_path / "runs"
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        daemons.append(start_daemon(tmp_path / name, "--state-dir", str(tmp_path / name / "state"), logdir=logdir))
    a, b = daemons
    writer = SummaryWriter("moved", address=f"{a.address},{b.address}", backoff_secs=(0.05, 0.2))
    try:
        log_losses(writer, range(100))
        writer.flush(timeout=10)
        assert a.terminate() == 0
        log_losses(writer, range(100, 200))
    finally:
        writer.close()
    assert steps_in(logdir / "moved") == list(range(200))
    assert "moved" in b.log_path.read_text()
