"""A redirect never carries a credential to an address nobody configured.

A daemon of a bucket logdir names a run's owner (`OWNER_ADDRESS_KEY`) from the run's lease in the bucket, which
anyone who can write the bucket can forge. Here a small real gRPC server on loopback stands in for a daemon that
was fooled so: it answers `OpenSession` exactly as a daemon does when another holds the run's lease, naming a
capture server, a real gRPC server on loopback that records the metadata of every call it gets. The writer,
`summaryd ship` and `summaryd replay` must not follow it (nor send their token there), must say so, and must still
follow a redirect to an address they were given. The same with a forged lease in a real bucket is in
`test_redirect_objstore`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from _redirecting import fooled_daemon

from _credentials import TOKEN
from _shipping import VERSION_RECORD, append, scalar
from _support import (
    FORKING_WRITER,
    Daemon,
    Loopback,
    event_files,
    leave_a_spool,
    log_losses,
    read_events,
    run_script,
    steps_in,
    summaryd_run,
    unused_port,
    wait_for,
)
from summaryd.cli import main
from summaryd.client import Sender, SummaryWriter
from summaryd.client._environment import parse_address
from summaryd.client._options import ClientOptions
from summaryd.client._patch._shipper import Shipper
from summaryd.client._sender._targets import DaemonTargets, RedirectRefusedError
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import address_key


@pytest.fixture
def fooled(capture: Loopback) -> Iterator[Loopback]:
    server = fooled_daemon(capture.address)
    yield server
    server.stop()


def test_addresses_are_the_same_only_when_they_surely_name_one_daemon() -> None:
    same = [("Node-A.example", "node-a.example:6065"), ("[0:0::1]:7000", "[::1]:7000"), ("10.0.0.1", "10.0.0.1:6065")]
    for left, right in same:
        assert address_key(parse_address(left)) == address_key(parse_address(right))
    # Nothing is resolved: a name and an address of it are two addresses, as are two ports.
    differ = [("localhost:6065", "127.0.0.1:6065"), ("a:6065", "a:6066"), ("a.example", "a.example."), ("a", "b")]
    for left, right in differ:
        assert address_key(parse_address(left)) != address_key(parse_address(right))


def test_redirect_allow_comes_from_the_argument_or_the_environment_and_a_bad_one_says_where(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert ClientOptions.make(redirect_allow="b, a:7", environ={}).redirect_allow == ("b:6065", "a:7")
    assert ClientOptions.make(redirect_allow=["c"], environ={}).redirect_allow == ("c:6065",)
    assert ClientOptions.make(environ={"SUMMARYD_REDIRECT_ALLOW": "d:1"}).redirect_allow == ("d:1",)
    assert ClientOptions.make(environ={}).redirect_allow == ()
    with pytest.raises(ValueError, match="SUMMARYD_REDIRECT_ALLOW: address 'http://d:1' is a URL"):
        ClientOptions.make(environ={"SUMMARYD_REDIRECT_ALLOW": "http://d:1"})
    with pytest.raises(SystemExit) as exited:
        main(["ship", ".", "--run", "r", "--once", "--redirect-allow", "a:99999"])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("summaryd ship: error: address 'a:99999': the port must be a number from 1 to 65535")


def test_targets_follow_a_redirect_only_to_an_address_they_were_given() -> None:
    targets = DaemonTargets(("a:1", "b:1"), ("Owner:1",))
    assert targets.redirect("owner:1") and targets.current == "Owner:1"  # allowed, dialled as given
    assert targets.redirect("B:1") and targets.current == "b:1"  # one of the list
    for forged in ("evil:1", "owner:2", "localhost:1", "http://owner:1", "", "x" * 10_000):
        with pytest.raises(RedirectRefusedError, match="not followed, and no token or certificate sent there"):
            targets.redirect(forged)
        assert targets.current == "b:1"


def test_a_writer_does_not_follow_a_redirect_to_an_address_it_was_not_given(
    fooled: Loopback, capture: Loopback, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "summaryd.client")
    began = time.monotonic()
    writer = SummaryWriter("forged", address=fooled.address, token=TOKEN, backoff_secs=(0.05, 0.2))
    log_losses(writer, range(10))
    report = writer.close(timeout=2)
    lasted = time.monotonic() - began
    assert capture.recorder.calls == []  # no call at all, so no token and no client certificate
    assert fooled.recorder.tokens() and set(fooled.recorder.tokens()) == {f"Bearer {TOKEN}"}  # its own daemon's
    assert report.delivered == 0 and report.undelivered == 10
    assert report.error is not None and f"sends this run's clients to '{capture.address}'" in report.error
    assert "not followed" in report.error
    refusals = [r for r in caplog.records if capture.address in r.getMessage()]
    assert refusals and all("not followed" in r.getMessage() for r in refusals)
    asked = len(fooled.recorder.calls)  # the writer asked again after each backoff (0.2 s at most)
    assert len(refusals) <= 1 + lasted / 10 < asked  # one line per 10 s, however often it asked


def test_a_writer_follows_a_redirect_to_one_of_its_addresses_or_to_redirect_allow(daemon: Daemon) -> None:
    owner = fooled_daemon(daemon.address)
    try:
        with SummaryWriter("allowed", address=owner.address, redirect_allow=daemon.address) as writer:
            log_losses(writer, range(20))
        with SummaryWriter("listed", address=f"{owner.address},{daemon.address}") as writer:
            log_losses(writer, range(20))
    finally:
        owner.stop()
    assert steps_in(daemon.logdir / "allowed") == list(range(20))
    assert steps_in(daemon.logdir / "listed") == list(range(20))


def test_summaryd_ship_does_not_follow_a_redirect_to_an_address_it_was_not_given(
    tmp_path: Path,
    fooled: Loopback,
    capture: Loopback,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SUMMARYD_TOKEN", TOKEN)
    append(tmp_path / "logs" / "events.out.tfevents.1.host", VERSION_RECORD, *(scalar(s) for s in range(5)))
    code = main(["ship", str(tmp_path / "logs"), "--run", "shipped", "--once", "--address", fooled.address])
    assert code == 1
    assert capture.recorder.calls == []
    assert set(fooled.recorder.tokens()) == {f"Bearer {TOKEN}"}
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("summaryd ship: delivered 0 records") and "not followed" in last and "Traceback" not in last


def test_summaryd_ship_follows_a_redirect_to_redirect_allow(
    tmp_path: Path, daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    owner = fooled_daemon(daemon.address)
    append(tmp_path / "logs" / "events.out.tfevents.1.host", VERSION_RECORD, *(scalar(s) for s in range(5)))
    try:
        argv = ["ship", str(tmp_path / "logs"), "--run", "shipped", "--once", "--address", owner.address]
        assert main([*argv, "--redirect-allow", daemon.address]) == 0
    finally:
        owner.stop()
    assert steps_in(daemon.logdir / "shipped") == list(range(5))


def test_summaryd_replay_does_not_follow_a_redirect_to_an_address_it_was_not_given(
    tmp_path: Path,
    fooled: Loopback,
    capture: Loopback,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spool = leave_a_spool(tmp_path / "spool", unused_port())
    monkeypatch.setenv("SUMMARYD_TOKEN", TOKEN)
    capsys.readouterr()
    assert main(["replay", str(spool), "--address", fooled.address]) == 1
    assert capture.recorder.calls == []
    assert set(fooled.recorder.tokens()) == {f"Bearer {TOKEN}"}
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{spool}: FAILED (daemon {fooled.address}, --address): ") and "not followed" in line
    assert spool.is_dir()  # kept for a replay to a daemon of the user's


def test_summaryd_replay_follows_a_redirect_to_redirect_allow(
    tmp_path: Path, daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    spool = leave_a_spool(tmp_path / "spool", unused_port())
    owner = fooled_daemon(daemon.address)
    try:
        assert main(["replay", str(spool), "--address", owner.address, "--redirect-allow", daemon.address]) == 0
    finally:
        owner.stop()
    assert f"to {daemon.address} (--address)" in capsys.readouterr().out
    assert len(steps_in(daemon.logdir / "left")) == 3 and not spool.exists()


@pytest.mark.parametrize("session_id", ["../escape", "a/b", "a\\b", "..", ".", "x..y"])
def test_a_session_id_that_could_leave_its_key_is_refused_at_the_edge(daemon: Daemon, session_id: str) -> None:
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.SummariesStub(channel)
        calls = [
            lambda: stub.OpenSession(
                pb.OpenSessionRequest(session_id=session_id, run="r", next_sequence=1), timeout=10
            ),
            lambda: stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), timeout=10),
            lambda: stub.Flush(pb.FlushRequest(session_id=session_id), timeout=10),
            lambda: list(stub.Write(iter([pb.WriteRequest(session_id=session_id, first_sequence=1)]), timeout=10)),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
            assert caught.value.details() == "session_id may not contain '/', '\\' or '..', nor be '.'; send a UUID"  # type: ignore[attr-defined]


def test_summaryd_run_hands_redirect_allow_to_the_command(
    tmp_path: Path, daemon: Daemon, fooled: Loopback, capture: Loopback
) -> None:
    """The command's writers follow a redirect to `--redirect-allow`, and without it send the other address
    nothing (though `SUMMARYD_TOKEN` gives them a token)."""
    owner = fooled_daemon(daemon.address)
    script = (
        "import sys\nfrom summaryd.client import SummaryWriter\n"
        "w = SummaryWriter(sys.argv[1], backoff_secs=(0.05, 0.2))\n"
        "for step in range(5):\n    w.add_scalar('x', 1.0, step)\nprint(w.close(timeout=2).delivered)\n"
    )
    env = {**os.environ, "SUMMARYD_TOKEN": TOKEN}
    try:
        allowed = summaryd_run(
            tmp_path,
            "--address",
            owner.address,
            "--redirect-allow",
            daemon.address,
            "--",
            sys.executable,
            "-c",
            script,
            "allowed",
            env=env,
        )
    finally:
        owner.stop()
    refused = summaryd_run(
        tmp_path, "--address", fooled.address, "--", sys.executable, "-c", script, "refused", env=env
    )
    assert (allowed.returncode, allowed.stdout.strip()) == (0, "5"), allowed.stderr
    assert steps_in(daemon.logdir / "allowed") == list(range(5))
    assert (refused.returncode, refused.stdout.strip()) == (0, "0"), refused.stderr
    assert "not followed" in refused.stderr and capture.recorder.calls == []


def test_a_following_shipper_keeps_trying_past_a_refused_redirect_and_says_why_at_the_end(
    tmp_path: Path, fooled: Loopback, capture: Loopback
) -> None:
    append(tmp_path / "logs" / "events.out.tfevents.1.host", VERSION_RECORD, scalar(0))
    shipper = Shipper(tmp_path / "logs", "followed", address=fooled.address, redirect_allow="")
    stop = threading.Event()
    asked_twice = threading.Thread(target=lambda: wait_for(lambda: len(fooled.recorder.calls) >= 2, 60, "a retry"))
    asked_twice.start()
    threading.Thread(target=lambda: (asked_twice.join(), stop.set())).start()
    totals = shipper.follow(stop, poll_secs=0.05)  # returns (does not raise) once stopped
    assert totals.records == 0 and totals.error is not None and "not followed" in totals.error
    assert capture.recorder.calls == []


def test_the_courier_follows_a_redirect_to_the_writers_allow_list_with_a_childs_outbox(
    tmp_path: Path, daemon: Daemon
) -> None:
    owner = fooled_daemon(daemon.address)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SUMMARYD_")}
    environ["SUMMARYD_SPOOL_DIR"] = str(tmp_path / "spool")
    try:
        # The parent follows the redirect (the owner is in its allow-list); its courier must too, with the child's.
        writer = {"address": owner.address, "redirect_allow": daemon.address}
        done = run_script(FORKING_WRITER, ["owned", json.dumps(writer)], environ)
    finally:
        owner.stop()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"ok": True, "delivered": 2}, done.stderr
    tags = [v.tag for path in event_files(daemon.logdir / "owned") for e in read_events(path) for v in e.summary.value]
    assert sorted(tags) == ["child", "parent"]


def test_summaryd_replay_tries_every_address_and_the_allow_list_its_spool_records(
    tmp_path: Path, daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    """The spool's writer was given a dead daemon, then one that sends its run to an owner of its allow-list:
    a plain `summaryd replay` (no `--address`) reaches the owner. A manifest of before (one address) still
    replays."""
    owner = fooled_daemon(daemon.address)
    dead = f"127.0.0.1:{unused_port()}"
    sender = Sender(
        "recorded",
        address=f"{dead},{owner.address}",
        redirect_allow=daemon.address,
        spool_dir=tmp_path / "spool",
        spool_after=0.1,
        backoff_secs=(0.05, 0.1),
    )
    owner.stop()  # away while the writer logs: everything goes to the spool
    for step in range(3):
        sender.submit(scalar(step), 40)
    wait_for(lambda: sender.report().spooled == 3, 30, "the events to be spooled")
    spool = Path(str(sender.close(timeout=0.5).spool_path))
    manifest = json.loads((spool / "manifest.json").read_text())
    assert manifest["addresses"] == [dead, owner.address] and manifest["redirect_allow"] == [daemon.address]
    owner = fooled_daemon(daemon.address)
    manifest["addresses"][1] = owner.address  # the owner's stand-in is back, on a port of its own
    (spool / "manifest.json").write_text(json.dumps(manifest))
    old = leave_a_spool(tmp_path / "old", unused_port())
    written = json.loads((old / "manifest.json").read_text())
    del written["addresses"], written["redirect_allow"]
    written["address"] = daemon.address
    (old / "manifest.json").write_text(json.dumps(written))
    try:
        capsys.readouterr()
        assert main(["replay", str(spool)]) == 0
        assert main(["replay", str(old)]) == 0
    finally:
        owner.stop()
    assert f"to {daemon.address} (recorded in the spool)" in capsys.readouterr().out
    assert steps_in(daemon.logdir / "recorded") == [0, 1, 2] and not spool.exists()
    assert len(steps_in(daemon.logdir / "left")) == 3 and not old.exists()


def test_projector_files_go_to_the_daemon_the_writer_was_sent_to(daemon: Daemon) -> None:
    """`add_embedding`'s uploads go where the session is: the owner the writer followed a redirect to."""
    owner = fooled_daemon(daemon.address)
    try:
        writer = SummaryWriter("embedded", address=owner.address, redirect_allow=daemon.address, worker="")
        writer.add_embedding(np.eye(2), tag="x")
        report = writer.close()
    finally:
        owner.stop()
    assert report.ok and not report.dropped, report
    assert (daemon.logdir / "embedded" / "00000" / "x" / "tensors.tsv").read_text() == "1.0\t0.0\n0.0\t1.0\n"
    assert [method for method, _ in owner.recorder.calls] == ["/summaryd.v1.Summaries/OpenSession"]


@pytest.mark.parametrize("named", ["xds", "dns:6065", "IPv4:7000", "vsock", "google-c2p:443"])
def test_a_host_grpc_would_read_as_a_target_scheme_is_no_address_and_no_redirect(named: str) -> None:
    """`xds:6065` would have gRPC ask an xDS control plane where to go, `dns:6065` resolve the name `6065`: neither
    the user nor a lease may name a daemon so."""
    with pytest.raises(ValueError, match=r"gRPC reads .* as a target scheme, not a host"):
        parse_address(named)
    with pytest.raises(RedirectRefusedError):
        DaemonTargets(("a:1",), ("b:1",)).redirect(named)
