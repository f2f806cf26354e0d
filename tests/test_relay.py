"""The node relay (`summaryd serve --upstream`): several `SummaryWriter` processes of one job write through a
relay to the daemon that holds their run, exactly once, with the aggregates exact, across a relay SIGKILLed
(restarted, or passed over for the owner itself), an owner SIGKILLed and restarted, and a token's tenancy.

Real daemons and a real relay on loopback; everything is read back with TensorBoard's own loader.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import grpc
import pytest
from _redirecting import fooled_daemon

from _aggregation import REDUCTIONS, expected, finish, scalars, start_workers, wait_aggregates_closed
from _support import Daemon, Loopback, start_daemon, unused_port, wait_for
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

STEPS = 1000
WORLD = 4


class Reachable(Protocol):
    @property
    def address(self) -> str: ...


def start_relay(workdir: Path, *upstream: Reachable, port: int = 0, extra: tuple[str, ...] = ()) -> Daemon:
    """A relay to `upstream` on loopback (`port` 0: one the OS picks)."""
    workdir.mkdir(exist_ok=True)
    addresses = ",".join(d.address for d in upstream)
    return start_daemon(workdir, "--upstream", addresses, "--listen", f"127.0.0.1:{port}", *extra)


def written(daemon: Daemon, run: str) -> int:
    """Events the daemon wrote of `run` so far (its open run's count)."""
    with grpc.insecure_channel(daemon.address) as channel:
        status = pb_grpc.SummariesStub(channel).GetStatus(pb.GetStatusRequest(), timeout=10)
    return sum(r.events_written for r in status.runs if r.run_dir.startswith(run))


def assert_exactly_once(owner: Daemon, world: int = WORLD, steps: int = STEPS) -> None:
    """Every rank's steps once each, in order, and each step's reductions exact over every rank."""
    job = owner.logdir / "job"
    for rank in range(world):
        assert [s for s, _ in scalars(job / f"rank-{rank}", "loss")] == list(range(steps)), rank
    for name in REDUCTIONS:
        points = scalars(job / name, "loss")
        assert [v for _, v in points] == [expected(step, range(world))[name] for step in range(steps)], name
    assert scalars(job / "summaryd", "count/loss") == [(step, float(world)) for step in range(steps)]


def start_owner(workdir: Path, *extra: str) -> Daemon:
    """The daemon that holds the job's run, its logdir and state in `workdir` (a restart there resumes)."""
    workdir.mkdir(exist_ok=True)
    return start_daemon(workdir, *extra)


def kill(daemon: Daemon) -> None:
    os.kill(daemon.pid, signal.SIGKILL)
    daemon.proc.wait(10)


def strike_mid_run(owner: Daemon) -> None:
    """Wait until the owner wrote part of the job, not all of it: a fault then strikes batches in flight."""
    wait_for(lambda: written(owner, "job/rank") > WORLD * STEPS // 4, 60, "a quarter of the job to be written")
    assert written(owner, "job/rank") < WORLD * STEPS, "the job ended before the fault: make it longer"


def test_a_job_through_a_relay_is_written_exactly_once(tmp_path: Path) -> None:
    owner = start_owner(tmp_path / "owner")
    relay = start_relay(tmp_path / "relay", owner)
    try:
        procs, _ = start_workers(relay, tmp_path, WORLD, steps=[0, STEPS])
        finish(procs)
        wait_aggregates_closed(owner)
        assert_exactly_once(owner)
        assert not (relay.logdir / "job").exists()  # the relay wrote nothing of its own
    finally:
        relay.stop()
        owner.stop()


# Long enough that a fault strikes mid-run: 100 steps, then a pause.
PAUSED = {"steps": [0, STEPS], "pause": 0.25}


def run_struck(
    tmp_path: Path, fault: Callable[[list[Daemon]], None], *, owner_port: int = 0, straight: bool = False
) -> None:
    """A job of `WORLD` workers through a relay to its owner (`straight`: the workers are given the owner's
    address after the relay's); `fault` strikes mid-run, given [owner, relay], which it may replace with
    restarted ones. Then every step is there exactly once, the aggregates exact."""
    listen = ("--listen", f"127.0.0.1:{owner_port}") if owner_port else ()
    parts = [start_owner(tmp_path / "owner", *listen)]
    try:
        parts.append(start_relay(tmp_path / "relay", parts[0]))
        owner, relay = parts
        dial = _Addressed(relay, f"{relay.address},{owner.address}") if straight else relay
        procs, _ = start_workers(dial, tmp_path, WORLD, **PAUSED)
        strike_mid_run(owner)
        fault(parts)
        finish(procs)
        wait_aggregates_closed(parts[0])
        assert_exactly_once(parts[0])
    finally:
        for daemon in reversed(parts):
            daemon.stop()


def test_a_relay_sigkilled_and_restarted_loses_and_doubles_nothing(tmp_path: Path) -> None:
    def restart_relay(parts: list[Daemon]) -> None:
        owner, relay = parts
        kill(relay)
        parts[1] = start_relay(tmp_path / "relay", owner, port=relay.port)

    run_struck(tmp_path, restart_relay)


@pytest.mark.slow
def test_clients_given_the_owner_too_go_straight_to_it_when_their_relay_is_killed(tmp_path: Path) -> None:
    run_struck(tmp_path, lambda parts: kill(parts[1]), straight=True)


@pytest.mark.slow
def test_an_owner_sigkilled_and_restarted_behind_the_relay_loses_and_doubles_nothing(tmp_path: Path) -> None:
    port = unused_port()

    def restart_owner(parts: list[Daemon]) -> None:
        kill(parts[0])
        parts[0] = start_owner(tmp_path / "owner", "--listen", f"127.0.0.1:{port}")

    run_struck(tmp_path, restart_owner, owner_port=port)


class _Addressed(Daemon):
    """A daemon given to the workers under another address list (`start_workers` reads `address`)."""

    def __init__(self, daemon: Daemon, addresses: str) -> None:
        super().__init__(daemon.proc, daemon.logdir, daemon.port, daemon.log_path)
        self._addresses = addresses

    @property
    def address(self) -> str:
        return self._addresses


TOKEN_A = "a" * 32
TOKEN_B = "b" * 32


def _open(stub: pb_grpc.SummariesStub, token: str, session_id: str, run: str) -> pb.OpenSessionResponse:
    request = pb.OpenSessionRequest(session_id=session_id, run=run, next_sequence=1)
    answer: pb.OpenSessionResponse = stub.OpenSession(
        request, metadata=(("authorization", f"Bearer {token}"),), timeout=10
    )
    return answer


def _write(stub: pb_grpc.SummariesStub, token: str, session_id: str) -> list[pb.WriteAck]:
    scalars = pb.ScalarColumns(tags=["loss"], tag_index=[0], step=[1], wall_time=[1.0], value=[0.5])
    request = pb.WriteRequest(session_id=session_id, first_sequence=1, scalars=scalars)
    return list(stub.Write(iter([request]), metadata=(("authorization", f"Bearer {token}"),), timeout=10))


def test_a_token_reaches_through_a_relay_only_the_runs_of_its_prefixes(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN_A} team-a/\n{TOKEN_B} team-b/\n")
    owner = start_owner(tmp_path / "owner", "--token-file", str(tokens))
    relay = start_relay(tmp_path / "relay", owner)
    try:
        with grpc.insecure_channel(relay.address) as channel:
            stub = pb_grpc.SummariesStub(channel)
            # Each token writes its own tenant's run through the relay.
            _open(stub, TOKEN_A, "00000000-0000-4000-8000-00000000000a", "team-a/run")
            assert _write(stub, TOKEN_A, "00000000-0000-4000-8000-00000000000a")[-1].acked_sequence == 1
            victim = "00000000-0000-4000-8000-00000000000b"
            _open(stub, TOKEN_B, victim, "team-b/run")
            # Token A may not open a session on B's run, nor write B's session, nor write without a token.
            with pytest.raises(grpc.RpcError) as opened:
                _open(stub, TOKEN_A, "00000000-0000-4000-8000-0000000000a2", "team-b/run")
            assert opened.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.RpcError) as wrote:
                _write(stub, TOKEN_A, victim)
            assert wrote.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.RpcError) as anonymous:
                list(stub.Write(iter([pb.WriteRequest(session_id=victim, first_sequence=1)]), timeout=10))
            assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # The relay stream is refused per session and goes on: B's own batch is then written.
            assert _write(stub, TOKEN_B, victim)[-1].acked_sequence == 1
        with grpc.insecure_channel(owner.address) as channel:
            status = pb_grpc.SummariesStub(channel).GetStatus(
                pb.GetStatusRequest(), metadata=(("authorization", f"Bearer {TOKEN_B}"),), timeout=10
            )
        assert [(s.run_dir, s.events_written) for s in status.sessions] == [("team-b/run", 1)]
    finally:
        relay.stop()
        owner.stop()


def test_a_relay_stream_refuses_a_session_without_its_token_and_carries_the_others(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN_A} team-a/\n")
    owner = start_owner(tmp_path / "owner", "--token-file", str(tokens))
    try:
        with grpc.insecure_channel(owner.address) as channel:
            stub = pb_grpc.SummariesStub(channel)
            ids = ["00000000-0000-4000-8000-0000000000c1", "00000000-0000-4000-8000-0000000000c2"]
            for session_id in ids:
                _open(stub, TOKEN_A, session_id, f"team-a/{session_id[-2:]}")
            batches = [
                pb.RelayBatch(write=pb.WriteRequest(session_id=ids[0]), authorization=f"Bearer {TOKEN_A}"),
                pb.RelayBatch(write=pb.WriteRequest(session_id=ids[1])),  # no token
                pb.RelayBatch(write=pb.WriteRequest(session_id=ids[1]), authorization=f"Bearer {TOKEN_B}"),
            ]
            answers = list(stub.Relay(iter([pb.RelayRequest(batches=batches)]), timeout=10))
        acks = [(a.session_id, a.code) for answer in answers for a in answer.acks]
        assert acks == [(ids[0], 0), (ids[1], grpc.StatusCode.UNAUTHENTICATED.value[0])]
    finally:
        owner.stop()


class _Upstream:
    """An address a relay is given that is no daemon started here (a stand-in server)."""

    def __init__(self, address: str) -> None:
        self.address = address


def test_a_relay_follows_a_redirect_to_an_upstream_it_was_given(tmp_path: Path) -> None:
    # A stand-in for a daemon that another's lease sends away: every session to the owner.
    owner = start_owner(tmp_path / "owner")
    sender = fooled_daemon(owner.address)
    relay = start_relay(tmp_path / "relay", _Upstream(sender.address), owner)
    try:
        procs, _ = start_workers(relay, tmp_path, WORLD, steps=[0, STEPS])
        finish(procs)
        wait_aggregates_closed(owner)
        assert_exactly_once(owner)
        assert {method for method, _ in sender.recorder.calls} == {"/summaryd.v1.Summaries/OpenSession"}
    finally:
        relay.stop()
        owner.stop()
        sender.stop()


def test_a_relay_never_follows_a_redirect_elsewhere_nor_sends_a_token_there(tmp_path: Path, capture: Loopback) -> None:
    sender = fooled_daemon(capture.address)
    relay = start_relay(tmp_path / "relay", _Upstream(sender.address))
    try:
        with grpc.insecure_channel(relay.address) as channel, pytest.raises(grpc.RpcError) as refused:
            _open(pb_grpc.SummariesStub(channel), TOKEN_A, "00000000-0000-4000-8000-0000000000d1", "run")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "not one of the relay's --upstream addresses: not followed" in (refused.value.details() or "")
        assert capture.recorder.calls == []
        assert sender.recorder.tokens() == [f"Bearer {TOKEN_A}"]  # the address it was given had it, once
    finally:
        relay.stop()
        sender.stop()
