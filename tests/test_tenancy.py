"""Tenancy: a token reaches only the runs under its prefixes, on every RPC, before and after a daemon restart.

One scenario runs against real daemons (one per phase: live, then restarted on the same logdir) and records
each cell of the matrix RPC x caller; the tests below judge the cells. The victim is a `team-a/` session; the
other tenant holds `team-ab/` (a prefix of the victim's team name, not of its runs); the revoked token could
reach `team-a/` until a SIGHUP re-read the token file without it. Around every refused call the scenario takes
a snapshot (the live sessions as a `*` token sees them, the files in the logdir, and whether the victim's own
Flush still finds its session as it was), so each cell shows both its status and that nothing changed.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import grpc
import pytest
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from _support import Daemon, start_daemon, steps_in, wait_for
from summaryd.server.security.auth import fingerprint
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

VICTIM = "victim-token-0123456789abcdef"  # team-a/
OTHER = "other-token-0123456789abcdefg"  # team-ab/
REVOKED = "revoked-token-0123456789abcd"  # team-a/, until the token file is re-read without it
ROOT = "root-token-0123456789abcdefgh"  # *
NARROWED = "narrowed-token-0123456789ab"  # team-a/ and team-c/, until the token file is re-read with team-a/ alone
WRONG = "wrong-token-never-issued-0000"

PHASES = ("live", "restarted")
RPCS = ("open_new", "open_resume", "write", "flush", "close", "put_file", "get_status")
SESSION_RPCS = ("write", "flush", "close", "put_file")
CALLERS = ("no_token", "wrong_token", "other_tenant", "revoked_token", "right_token")
ATTACKERS = CALLERS[:-1]
TOKEN = {"no_token": None, "wrong_token": WRONG, "other_tenant": OTHER, "revoked_token": REVOKED, "right_token": VICTIM}
ATTACKER_STEP = 1000  # steps the victim never writes: any of them in a file is an attacker's write that passed

OK = grpc.StatusCode.OK
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED


def _expected(rpc: str, caller: str) -> grpc.StatusCode:
    if caller == "right_token":
        return OK
    if caller == "other_tenant":
        return OK if rpc == "get_status" else PERMISSION_DENIED  # its status is filtered to team-ab/
    return UNAUTHENTICATED


@dataclass
class Outcome:
    code: grpc.StatusCode
    details: str = ""
    # What a refused call changed (empty when nothing did); not judged for the right token, which changes state.
    changed: list[str] = field(default_factory=list)
    # GetStatus: the run directories of the runs and sessions it showed.
    visible: list[str] = field(default_factory=list)
    answer: object = None


def _metadata(token: str | None) -> list[tuple[str, str]] | None:
    return [("authorization", f"Bearer {token}")] if token else None


def _batch(session_id: str, first: int, steps: list[int]) -> pb.WriteRequest:
    events = [
        Event(wall_time=1.0, step=s, summary=Summary(value=[Summary.Value(tag="t", simple_value=1.0)])) for s in steps
    ]
    return pb.WriteRequest(session_id=session_id, first_sequence=first, events=[e.SerializeToString() for e in events])


def _call(call: Callable[[], object]) -> Outcome:
    try:
        answer = call()
    except grpc.RpcError as exc:
        return Outcome(exc.code(), exc.details() or "")
    visible = []
    if isinstance(answer, pb.GetStatusResponse):
        visible = [r.run_dir for r in answer.runs] + [s.run_dir for s in answer.sessions]
    return Outcome(OK, visible=visible, answer=answer)


def _write(stub: pb_grpc.SummariesStub, batch: pb.WriteRequest, metadata: list[tuple[str, str]] | None) -> object:
    return list(stub.Write(iter([batch]), timeout=10, metadata=metadata))


class Stream:
    """A write stream kept open across calls, fed one batch at a time."""

    def __init__(self, stub: pb_grpc.SummariesStub, token: str) -> None:
        self._requests: queue.Queue[pb.WriteRequest | None] = queue.Queue()
        self._answers = stub.Write(iter(self._requests.get, None), timeout=60, metadata=_metadata(token))

    def send(self, request: pb.WriteRequest) -> int:
        self._requests.put(request)
        ack: pb.WriteAck = next(self._answers)
        return ack.acked_sequence

    def close(self) -> None:
        self._requests.put(None)  # ends the request iterator, whose thread would wait for it otherwise
        self._answers.cancel()


class Scenario:
    """Runs the whole matrix once: one daemon live, then one restarted on the same logdir and state."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.logdir = root / "runs"
        self.victim = str(uuid.uuid4())
        self.closing = {phase: str(uuid.uuid4()) for phase in PHASES}  # closed by the right token, one a phase
        self.next_sequence = 1  # the victim's next sequence number
        self.cells: dict[tuple[str, str, str], Outcome] = {}
        self.unknown: dict[tuple[str, str], Outcome] = {}  # (phase, rpc): the other tenant on an unknown id
        # phase: the next batch, after the SIGHUP, on the open stream of the revoked and of the narrowed token
        self.open_stream: dict[str, Outcome] = {}
        self.narrowed_stream: dict[str, Outcome] = {}
        self.revoked_steps: dict[str, list[int]] = {}
        self.narrowed_steps: dict[str, list[int]] = {}
        self.logs: dict[str, str] = {}
        self.victim_events_received: dict[str, float] = {}  # phase: the metric, scraped at the phase's end
        self.root_visible: dict[str, list[str]] = {}
        self.victim_calls: list[Outcome] = []  # the victim's own writes between the phases' cells, and its close
        self.exit_codes: list[int] = []
        self.stub: pb_grpc.SummariesStub

    def run(self) -> None:
        for phase in PHASES:
            self._write_tokens(reloaded=False)
            tokens = str(self.root / "tokens")
            daemon = start_daemon(
                self.root, "--token-file", tokens, "--metrics-listen", "127.0.0.1:0", logdir=self.logdir
            )
            try:
                with grpc.insecure_channel(daemon.address) as channel:
                    self.stub = pb_grpc.SummariesStub(channel)
                    if phase == "live":
                        self._set_up()
                    self._phase(phase, daemon)
                    if phase == "restarted":
                        close = pb.CloseSessionRequest(session_id=self.victim)
                        call = partial(self.stub.CloseSession, close, timeout=10, metadata=_metadata(VICTIM))
                        self.victim_calls.append(_call(call))
            finally:
                self.exit_codes.append(daemon.terminate())

    def _set_up(self) -> None:
        """The victim's session with its first batch, and one written session a phase for the right token to close."""
        self.stub.OpenSession(self._open(self.victim, "team-a/victim"), timeout=10, metadata=_metadata(VICTIM))
        self._victim_writes()
        for phase in PHASES:
            run = f"team-a/closing-{phase}"
            self.stub.OpenSession(self._open(self.closing[phase], run), timeout=10, metadata=_metadata(VICTIM))
            # One event, so that the session is remembered across the restart (an unused one is not).
            batch = _batch(self.closing[phase], 1, [0])
            list(self.stub.Write(iter([batch]), timeout=10, metadata=_metadata(VICTIM)))

    def _write_tokens(self, *, reloaded: bool) -> None:
        lines = [f"{VICTIM} team-a/", f"{OTHER} team-ab/", f"{ROOT} *"]
        lines += [f"{NARROWED} team-a/"] if reloaded else [f"{NARROWED} team-a/ team-c/", f"{REVOKED} team-a/"]
        staged = self.root / "tokens.new"
        staged.write_text("\n".join(lines) + "\n")
        staged.rename(self.root / "tokens")  # whole, so that the daemon never reads half a file

    @staticmethod
    def _open(session_id: str, run: str, next_sequence: int = 0) -> pb.OpenSessionRequest:
        return pb.OpenSessionRequest(session_id=session_id, run=run, next_sequence=next_sequence)

    def _victim_writes(self) -> None:
        step = self.next_sequence
        request = _batch(self.victim, step, [step])
        outcome = _call(lambda: list(self.stub.Write(iter([request]), timeout=10, metadata=_metadata(VICTIM))))
        self.victim_calls.append(outcome)
        if outcome.code == OK:
            self.next_sequence += 1

    def _phase(self, phase: str, daemon: Daemon) -> None:
        stub = self.stub
        # The other tenant's own live session, which its GetStatus must show.
        stub.OpenSession(self._open(str(uuid.uuid4()), f"team-ab/own-{phase}"), timeout=10, metadata=_metadata(OTHER))
        # The revoked and the narrowed token write on streams they keep open across the SIGHUP that changes them.
        doomed, narrowed = str(uuid.uuid4()), str(uuid.uuid4())
        stub.OpenSession(self._open(doomed, f"team-a/revoked-{phase}"), timeout=10, metadata=_metadata(REVOKED))
        stub.OpenSession(self._open(narrowed, f"team-c/narrowed-{phase}"), timeout=10, metadata=_metadata(NARROWED))
        streams = Stream(stub, REVOKED), Stream(stub, NARROWED)
        try:
            assert streams[0].send(_batch(doomed, 1, [1])) == 1
            assert streams[1].send(_batch(narrowed, 1, [1])) == 1
            self._write_tokens(reloaded=True)
            os.kill(daemon.proc.pid, signal.SIGHUP)
            wait_for(lambda: "SIGHUP: 4 tokens" in daemon.log(), 20, "the token file to be re-read")
            self.open_stream[phase] = _call(lambda: streams[0].send(_batch(doomed, 2, [2])))
            self.narrowed_stream[phase] = _call(lambda: streams[1].send(_batch(narrowed, 2, [2])))
            self.logs[phase] = daemon.log()
        finally:
            for stream in streams:
                stream.close()
        self.revoked_steps[phase] = steps_in(self.logdir / "team-a" / f"revoked-{phase}")
        self.narrowed_steps[phase] = steps_in(self.logdir / "team-c" / f"narrowed-{phase}")

        for caller in ATTACKERS:
            for rpc in RPCS:
                before = self._snapshot()
                outcome = self._cell(rpc, caller, phase)
                after = self._snapshot()
                outcome.changed = [f"{b!r} became {a!r}" for b, a in zip(before, after, strict=True) if a != b]
                self.cells[phase, rpc, caller] = outcome
        unknown = str(uuid.uuid4())
        for rpc in SESSION_RPCS:
            self.unknown[phase, rpc] = self._cell(rpc, "other_tenant", phase, session_id=unknown)
        for rpc in RPCS:  # in this order: the resume makes the victim's session live again after the restart
            self.cells[phase, rpc, "right_token"] = self._cell(rpc, "right_token", phase)
        status = stub.GetStatus(pb.GetStatusRequest(), timeout=10, metadata=_metadata(ROOT))
        self.root_visible[phase] = [s.run_dir for s in status.sessions]
        self._victim_writes()  # the victim still writes once every other caller has had its go
        [port] = re.findall(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", daemon.log())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            scraped = answer.read().decode()
        victim = re.search(r'^summaryd_events_received_total\{run="team-a/victim"\} (\S+)$', scraped, re.M)
        self.victim_events_received[phase] = float(victim.group(1)) if victim else 0.0

    def _cell(self, rpc: str, caller: str, phase: str, session_id: str | None = None) -> Outcome:
        """One call of `rpc` by `caller` aimed at the victim's session (the right token at its own sessions)."""
        stub, metadata = self.stub, _metadata(TOKEN[caller])
        right = caller == "right_token"
        target = session_id or self.victim
        call: Callable[[], object]
        if rpc == "open_new":
            request = self._open(str(uuid.uuid4()), f"team-a/{'right' if right else 'attacker'}-{phase}")
            call = partial(stub.OpenSession, request, timeout=10, metadata=metadata)
        elif rpc == "open_resume":
            # The other tenant names a run it may write: only the session's own run can refuse it.
            run = f"team-ab/own-{phase}" if caller == "other_tenant" else "team-a/victim"
            resume = self._open(target, run, self.next_sequence)
            call = partial(stub.OpenSession, resume, timeout=10, metadata=metadata)
        elif rpc == "write":
            batch = _batch(target, self.next_sequence, [self.next_sequence] if right else [ATTACKER_STEP])
            call = partial(_write, stub, batch, metadata)
        elif rpc == "flush":
            flush = pb.FlushRequest(session_id=target, durable=True)
            call = partial(stub.Flush, flush, timeout=10, metadata=metadata)
        elif rpc == "close":
            close = pb.CloseSessionRequest(session_id=self.closing[phase] if right else target)
            call = partial(stub.CloseSession, close, timeout=10, metadata=metadata)
        elif rpc == "put_file":
            put = pb.PutFileRequest(session_id=target, path=f"{caller}-{phase}.txt", content=b"x")
            call = partial(stub.PutFile, put, timeout=10, metadata=metadata)
        else:
            assert rpc == "get_status"
            call = partial(stub.GetStatus, pb.GetStatusRequest(), timeout=10, metadata=metadata)
        outcome = _call(call)
        if rpc == "write" and right and outcome.code == OK:
            self.next_sequence += 1
        return outcome

    def _snapshot(self) -> tuple[object, ...]:
        """What a refused call must leave as it was: live sessions, logdir files, the victim's session."""
        status = self.stub.GetStatus(pb.GetStatusRequest(), timeout=10, metadata=_metadata(ROOT))
        sessions = sorted((s.session_id, s.run_dir, s.acked_sequence, s.events_written) for s in status.sessions)
        files = sorted(
            (str(p.relative_to(self.logdir)), p.stat().st_size if p.is_file() else 0)
            for p in self.logdir.rglob("*")
            if ".summaryd" not in p.parts  # the daemon's own state
        )
        probe = _call(
            lambda: self.stub.Flush(pb.FlushRequest(session_id=self.victim), timeout=10, metadata=_metadata(VICTIM))
        )
        return sessions, files, (probe.code, probe.details)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    scenario = Scenario(tmp_path_factory.mktemp("tenancy"))
    scenario.run()
    yield scenario


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("rpc", RPCS)
@pytest.mark.parametrize("phase", PHASES)
def test_auth_matrix(scenario: Scenario, phase: str, rpc: str, caller: str) -> None:
    """Each RPC by each caller, against the live daemon and against one restarted on the same state."""
    outcome = scenario.cells[phase, rpc, caller]
    assert outcome.code == _expected(rpc, caller), outcome.details
    assert "\n" not in outcome.details
    if caller != "right_token":
        assert outcome.changed == [], f"a refused {rpc} changed the daemon's state"
    if caller == "other_tenant":
        assert "victim" not in outcome.details, "a refusal must not tell another tenant about the victim's session"
        if rpc != "get_status":
            assert "token" in outcome.details
    if rpc == "get_status" and outcome.code == OK:
        prefix = "team-ab/" if caller == "other_tenant" else "team-a/"
        assert outcome.visible and all(run.startswith(prefix) for run in outcome.visible), outcome.visible
    if rpc == "get_status" and caller == "right_token":
        assert "team-a/victim" in outcome.visible


def test_an_unknown_session_id_is_refused_like_another_tenants(scenario: Scenario) -> None:
    """A token that cannot reach the victim's session learns nothing from an id: known or not, one answer."""
    for phase in PHASES:
        for rpc in SESSION_RPCS:
            known, unknown = scenario.cells[phase, rpc, "other_tenant"], scenario.unknown[phase, rpc]
            assert (unknown.code, unknown.details) == (known.code, known.details), (phase, rpc)


@pytest.mark.parametrize("phase", PHASES)
def test_a_revoked_token_is_refused_on_its_open_stream(scenario: Scenario, phase: str) -> None:
    """The stream opened before the SIGHUP gets its next batch refused, and that batch is not written."""
    outcome = scenario.open_stream[phase]
    assert outcome.code == UNAUTHENTICATED, outcome.details
    assert "token file" in outcome.details
    assert scenario.revoked_steps[phase] == [1]
    [line] = [line for line in scenario.logs[phase].splitlines() if "no longer in the token file" in line]
    assert fingerprint(REVOKED) in line and REVOKED not in scenario.logs[phase]


@pytest.mark.parametrize("phase", PHASES)
def test_a_narrowed_token_is_refused_on_its_open_stream(scenario: Scenario, phase: str) -> None:
    """A token whose prefixes no longer cover the run of its open stream gets its next batch refused."""
    outcome = scenario.narrowed_stream[phase]
    assert outcome.code == PERMISSION_DENIED, outcome.details
    assert f"team-c/narrowed-{phase}" in outcome.details
    assert scenario.narrowed_steps[phase] == [1]


def test_the_victim_is_unharmed(scenario: Scenario) -> None:
    """After every refused call, in both phases: the victim wrote and closed, each of its events exactly once,
    and no other caller's event, file or run directory reached the logdir."""
    assert scenario.exit_codes == [0, 0]
    assert [(c.code, c.details) for c in scenario.victim_calls] == [(OK, "")] * 4
    closed = scenario.victim_calls[-1].answer
    assert isinstance(closed, pb.CloseSessionResponse) and closed.acked_sequence == 5
    assert steps_in(scenario.logdir / "team-a" / "victim") == [1, 2, 3, 4, 5]
    # Run directories are made at their first event: walk whatever exists.
    for run_dir in (p for p in scenario.logdir.rglob("*") if p.is_dir() and any(p.glob("*tfevents*"))):
        assert ATTACKER_STEP not in steps_in(run_dir), run_dir
    files = sorted(p.name for p in (scenario.logdir / "team-a" / "victim").iterdir() if "tfevents" not in p.name)
    assert files == ["right_token-live.txt", "right_token-restarted.txt"]
    assert not any((scenario.logdir / "team-a").glob("attacker-*"))
    # Its run's metrics count its own events only: 3 written while live, 2 more after the restart.
    assert scenario.victim_events_received == {"live": 3.0, "restarted": 2.0}
    # A '*' token sees every tenant.
    for phase in PHASES:
        assert {run.split("/")[0] for run in scenario.root_visible[phase]} == {"team-a", "team-ab", "team-c"}


def _serve(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "summaryd.server", "serve", "--logdir", str(tmp_path / "runs"), *flags]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("value", ["0.0.0.0:0", "[::]:0", "metrics.example.org:9090"])
def test_non_loopback_metrics_need_insecure(tmp_path: Path, value: str) -> None:
    """Metrics name every run and have no token: a token file for gRPC does not make them safe to expose."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{VICTIM} team-a/\n")
    result = _serve(tmp_path, "--listen", "127.0.0.1:0", "--token-file", str(tokens), "--metrics-listen", value)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]  # after argparse's usage line
    assert "--metrics-listen" in line and "--insecure" in line and "loopback" in line


def test_metrics_listen_needs_host_and_port(tmp_path: Path) -> None:
    result = _serve(tmp_path, "--metrics-listen", "9090")
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]  # after argparse's usage line
    assert "--metrics-listen" in line and "HOST:PORT" in line


def test_insecure_non_loopback_metrics_start_with_a_warning(tmp_path: Path) -> None:
    """With --insecure they are served, and the daemon says what that exposes. Run in a private network
    namespace, where 0.0.0.0 reaches only its own loopback."""
    port_file = tmp_path / "port"
    script = (
        f"ip link set lo up && exec {sys.executable} -m summaryd.server serve --logdir {tmp_path / 'runs'} "
        f"--listen 127.0.0.1:0 --metrics-listen 0.0.0.0:0 --insecure --port-file {port_file}"
    )
    log_path = tmp_path / "daemon.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["unshare", "--net", "sh", "-c", script], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: proc.poll() is not None or "run's name" in log_path.read_text(), 30, "the metrics warning")
        warnings = [line for line in log_path.read_text().splitlines() if "WARNING" in line]
        assert any("metrics on 0.0.0.0:0" in line and "--insecure" in line for line in warnings), warnings
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0


def test_a_missing_token_file_is_one_line(tmp_path: Path) -> None:
    absent = tmp_path / "absent"
    result = _serve(tmp_path, "--listen", "127.0.0.1:0", "--token-file", str(absent))
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert f"--token-file {absent}: No such file or directory" in line, line


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("short team-a/", "at least 16 characters"),
        (f"{VICTIM}", "at least one run prefix"),
        (f"{VICTIM} team-*", "not patterns"),
        (f"{VICTIM} ./team-a", "'.' or '..'"),
        (f"{VICTIM} team-a//x", "empty"),
        (f"{VICTIM} /srv/runs/team-a", "absolute"),
    ],
)
def test_a_token_file_that_cannot_mean_what_it_says_is_one_line(tmp_path: Path, line: str, says: str) -> None:
    """A prefix that would never match (a pattern, a path not in run-path form) is refused at start-up, in one
    line naming the file's line, before the logdir or its state is created."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# token prefixes\n{line}\n")
    result = _serve(tmp_path, "--listen", "127.0.0.1:0", "--token-file", str(tokens))
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]  # after argparse's usage line
    assert f"{tokens}:2:" in last and says in last, last
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()
