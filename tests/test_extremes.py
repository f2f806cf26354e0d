"""One client cannot hurt the others: every field a client sends, at its extremes, is bounded at the edge, the
daemon stays up, `GetStatus` keeps working for everyone, and its log stays one line per event."""

from __future__ import annotations

import io
import json
import logging
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from _support import Daemon, start_daemon, wait_for
from summaryd.server.operations.logs import MAX_MESSAGE_CHARS, Throttle, configure_logging
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

# Codes an extreme request may get; anything else (UNKNOWN, INTERNAL) is a daemon bug.
EXPECTED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
# One event of the daemon's text log: time, level, logger, message.
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")
LONGEST_LINE = MAX_MESSAGE_CHARS + 200  # the message, its cut marker, time, level and logger name
FORGED = "\n2026-01-01 00:00:00,000 ERROR summaryd.server.service: forged"


def scalar(step: int, tag: str = "loss") -> bytes:
    summary = Summary(value=[Summary.Value(tag=tag, simple_value=1.0)])
    return Event(wall_time=1.0, step=step, summary=summary).SerializeToString()


def assert_one_line_per_event(log: str) -> None:
    """Every line of the daemon's log is one event: no forged line, no traceback, none past the bound."""
    for line in log.splitlines():
        assert LOG_LINE.match(line), f"not a log event of its own: {line[:200]!r}"
        assert len(line) <= LONGEST_LINE, f"a {len(line)}-character log line: {line[:200]!r}"


def status(address: str) -> pb.GetStatusResponse:
    """`GetStatus` as any other caller makes it: a fresh channel with gRPC's default limits."""
    with grpc.insecure_channel(address) as channel:
        answer: pb.GetStatusResponse = pb_grpc.SummariesStub(channel).GetStatus(pb.GetStatusRequest(), timeout=10)
        return answer


@pytest.fixture
def stub(daemon: Daemon) -> Iterator[pb_grpc.SummariesStub]:
    with grpc.insecure_channel(daemon.address) as channel:
        yield pb_grpc.SummariesStub(channel)


def refused(call: object, *args: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        result = call(*args, timeout=30)  # type: ignore[operator]
        if not isinstance(result, pb.OpenSessionResponse | pb.FlushResponse | pb.CloseSessionResponse):
            list(result)  # a Write stream
    return caught.value


# ---- integers -----------------------------------------------------------------------------------------------


def test_sequence_numbers_past_the_highest_are_refused_and_status_keeps_working(
    daemon: Daemon, stub: pb_grpc.SummariesStub
) -> None:
    """`next_sequence=2**64-1` and a batch past 2**63-1 are INVALID_ARGUMENT naming the field; nothing the daemon
    keeps can overflow a proto field, so `GetStatus` and resuming the session work."""
    session = str(uuid.uuid4())
    error = refused(stub.OpenSession, pb.OpenSessionRequest(session_id=session, run="r", next_sequence=2**64 - 1))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "next_sequence" in error.details() and str(2**63 - 1) in error.details()

    stub.OpenSession(pb.OpenSessionRequest(session_id=session, run="r", next_sequence=2**63 - 1), timeout=10)
    batch = pb.WriteRequest(session_id=session, first_sequence=2**63 - 1, events=[scalar(0), scalar(1)])
    error = refused(stub.Write, iter([batch]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "first_sequence" in error.details()
    [ack] = stub.Write(iter([pb.WriteRequest(session_id=session, first_sequence=2**63 - 1, events=[scalar(0)])]))
    assert ack.acked_sequence == 2**63 - 1

    assert [s.acked_sequence for s in status(daemon.address).sessions] == [2**63 - 1]
    answer = stub.OpenSession(pb.OpenSessionRequest(session_id=session, run="r", next_sequence=1), timeout=10)
    assert answer.last_sequence == 2**63 - 1


@pytest.mark.parametrize(
    ("field", "opening"),
    [
        ("world_size", pb.OpenSessionRequest(world_size=2**32 - 1)),
        ("client.pid", pb.OpenSessionRequest(client=pb.ClientIdentity(pid=-1))),
        ("client.pid", pb.OpenSessionRequest(client=pb.ClientIdentity(pid=2**63 - 1))),
    ],
    ids=["world_size", "negative-pid", "huge-pid"],
)
def test_integers_out_of_range_are_refused_naming_the_field(
    stub: pb_grpc.SummariesStub, field: str, opening: pb.OpenSessionRequest
) -> None:
    opening.session_id, opening.run = str(uuid.uuid4()), "r"
    error = refused(stub.OpenSession, opening)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(f"{field} is ") and "must be 0.." in error.details()


# ---- strings ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "identity"),
    [
        ("client.host", pb.ClientIdentity(host="h" * (5 << 20))),
        ("client.host", pb.ClientIdentity(host="node-1" + FORGED)),
        ("client.framework", pb.ClientIdentity(framework="torch\u202e")),
        ("client.version", pb.ClientIdentity(version="v" * 65)),
    ],
    ids=["5MiB-host", "newline-host", "bidi-framework", "long-version"],
)
def test_oversized_or_control_identity_strings_are_refused(
    daemon: Daemon, stub: pb_grpc.SummariesStub, field: str, identity: pb.ClientIdentity
) -> None:
    """A client string the daemon would keep, show in `summaryd status` and log is bounded and printable."""
    request = pb.OpenSessionRequest(session_id=str(uuid.uuid4()), run="r", client=identity)
    error = refused(stub.OpenSession, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(field)
    assert len(error.details()) < 200
    assert status(daemon.address).sessions == []


def test_every_rpc_refuses_an_oversized_session_id_without_echoing_it(stub: pb_grpc.SummariesStub) -> None:
    huge = "s" * (3 << 20)
    calls = [
        (stub.Flush, pb.FlushRequest(session_id=huge)),
        (stub.CloseSession, pb.CloseSessionRequest(session_id=huge)),
        (stub.PutFile, pb.PutFileRequest(session_id=huge, path="a.txt", content=b"x")),
        (stub.Write, iter([pb.WriteRequest(session_id=huge)])),
        (stub.OpenSession, pb.OpenSessionRequest(session_id=huge, run="r")),
    ]
    for call, request in calls:
        error = refused(call, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details().startswith("session_id must be 1..128 printable characters")


def test_log_lines_escape_control_characters_and_cut_long_values(capsys: pytest.CaptureFixture[str]) -> None:
    """The daemon's log handler makes every record one bounded line, whatever its arguments carry."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        for log_format in ("text", "json"):
            configure_logging("info", log_format)
            logging.getLogger("summaryd.server.service").info(
                "session opened by %s on %r: %s", "node-1" + FORGED, "run\u202e\u2028", "x" * (8 << 20)
            )
            lines = capsys.readouterr().err.splitlines()
            assert len(lines) == 1
            [line] = lines
            assert len(line) <= LONGEST_LINE
            message = json.loads(line)["message"] if log_format == "json" else line
            assert "node-1\\n2026-01-01" in message
            assert "more characters]" in message
            assert "\u202e" not in line and "\u2028" not in line
        # A traceback (the daemon's own failures) follows its event line indented, its text escaped too.
        configure_logging("info", "text")
        try:
            raise ValueError("bad host " + FORGED)
        except ValueError:
            logging.getLogger("summaryd.server.service").exception("failed for %s", "node-1")
        event, *traceback = capsys.readouterr().err.splitlines()
        assert LOG_LINE.match(event) and event.endswith("failed for node-1")
        assert traceback and all(line.startswith("    ") for line in traceback)  # the forged line too
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])


# ---- garbage protobuf ---------------------------------------------------------------------------------------


def test_garbage_protobuf_is_invalid_argument_and_one_log_line(daemon: Daemon) -> None:
    """Bytes that do not parse as the request message: INVALID_ARGUMENT, no traceback, one WARNING per method."""
    garbage = b"\xff\xff\xff\xff"
    methods = ["OpenSession", "Flush", "CloseSession", "PutFile", "GetStatus"]
    with grpc.insecure_channel(daemon.address) as channel:
        for _ in range(3):
            for method in methods:
                error = refused(channel.unary_unary(f"/summaryd.v1.Summaries/{method}"), garbage)
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, error.details())
                assert "does not parse" in error.details()
            error = refused(channel.stream_stream("/summaryd.v1.Summaries/Write"), iter([garbage]))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            error = refused(channel.unary_unary("/grpc.health.v1.Health/Check"), garbage)
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        health = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            health_pb2.HealthCheckRequest.SerializeToString,
            health_pb2.HealthCheckResponse.FromString,
        )
        assert health(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    log = daemon.log()
    assert "Traceback" not in log and " ERROR " not in log, log
    unparsed = [line for line in log.splitlines() if "does not parse" in line]
    assert len(unparsed) == len(methods) + 2, log  # every method's first refusal; the rest within the interval
    assert all(" WARNING summaryd.server.refusals: refused " in line for line in unparsed)
    assert_one_line_per_event(log)


# ---- abandoned sessions -------------------------------------------------------------------------------------


def test_abandoned_sessions_leave_no_directory_and_no_record(tmp_path: Path) -> None:
    """Sessions opened and never used make no run directory and leave nothing in the session store once
    released; a session that wrote is remembered as before."""
    daemon = start_daemon(tmp_path, "--session-lease", "1")
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb_grpc.SummariesStub(channel)
            abandoned = [str(uuid.uuid4()) for _ in range(200)]
            for i, session in enumerate(abandoned):
                stub.OpenSession(pb.OpenSessionRequest(session_id=session, run=f"abandoned/{i}"), timeout=10)
            assert not (daemon.logdir / "abandoned").exists()
            used = str(uuid.uuid4())
            stub.OpenSession(pb.OpenSessionRequest(session_id=used, run="used"), timeout=10)
            list(stub.Write(iter([pb.WriteRequest(session_id=used, first_sequence=1, events=[scalar(0)])])))
            wait_for(lambda: not status(daemon.address).sessions, 60, "every session to be released")
        assert daemon.terminate() == 0
        store = (daemon.logdir / ".summaryd" / "sessions").read_text()
        assert used in store
        assert not [session for session in abandoned if session in store]
        assert not (daemon.logdir / "abandoned").exists()
    finally:
        daemon.terminate()


# ---- refusals in the log ------------------------------------------------------------------------------------


def test_refusals_are_logged_at_the_default_level_once_per_kind(tmp_path: Path) -> None:
    """A bad run path and a tag over the limit, each sent again and again: one WARNING line each, with the
    reason the client got."""
    daemon = start_daemon(tmp_path, "--max-tag-bytes", "8")
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb_grpc.SummariesStub(channel)
            for _ in range(5):
                error = refused(stub.OpenSession, pb.OpenSessionRequest(session_id=str(uuid.uuid4()), run="../x"))
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            session = str(uuid.uuid4())
            stub.OpenSession(pb.OpenSessionRequest(session_id=session, run="tags"), timeout=10)
            for _ in range(5):
                batch = pb.WriteRequest(session_id=session, first_sequence=1, events=[scalar(0, "t" * 40)])
                assert refused(stub.Write, iter([batch])).code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        daemon.terminate()
    warnings = [line for line in daemon.log().splitlines() if " WARNING " in line]
    bad_run = [line for line in warnings if "OpenSession" in line]
    assert len(bad_run) == 1 and "INVALID_ARGUMENT" in bad_run[0] and "'..'" in bad_run[0], warnings
    bad_tag = [line for line in warnings if "Write" in line]
    assert len(bad_tag) == 1 and "--max-tag-bytes" in bad_tag[0], warnings


def test_a_throttled_line_says_how_many_were_left_out() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("summaryd.test.throttle")
    logger.addHandler(logging.StreamHandler(stream))
    logger.propagate = False
    now = [0.0]
    throttle = Throttle(logger, interval=10.0, clock=lambda: now[0])
    try:
        for second in range(25):
            now[0] = float(second)
            throttle.warning("bad run", "refused run %r", f"run-{second}")
            throttle.warning("other", "refused other")
    finally:
        logger.handlers.clear()
    assert stream.getvalue().splitlines() == [
        "refused run 'run-0'",
        "refused other",
        "refused run 'run-10' (and 9 more like this since the last such line, not logged)",
        "refused other (and 9 more like this since the last such line, not logged)",
        "refused run 'run-20' (and 9 more like this since the last such line, not logged)",
        "refused other (and 9 more like this since the last such line, not logged)",
    ]


# ---- all fields at their extremes ---------------------------------------------------------------------------

UINT64 = st.sampled_from([0, 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1])
UINT32 = st.sampled_from([0, 1, 2**31, 2**32 - 1])
INT64 = st.sampled_from([-(2**63), -1, 0, 1, 2**31, 2**63 - 1])
HOSTILE_TEXT = [
    "",
    "a",
    "rank-0",
    "a\nb",
    FORGED,
    "\x00",
    "nul\x00inside",
    "\r",
    "\x1b[31mred",
    "\u202eevil",
    "\u2028",
    "e\u0301",
    "../x",
    "a/b",
]
SIZES = [255, 256, 4096, 65_536, 1 << 20, 3 << 20]
texts = st.one_of(
    st.sampled_from(HOSTILE_TEXT),
    st.text(max_size=24),
    st.tuples(st.sampled_from(SIZES), st.sampled_from(["x", "\n", "é"])).map(lambda sc: sc[1] * sc[0]),
)
session_ids = st.one_of(st.builds(lambda: str(uuid.uuid4())), texts)


def test_every_field_at_its_extremes_leaves_the_daemon_serving_everyone(daemon: Daemon) -> None:
    """OpenSession, Write, Flush, PutFile and CloseSession with integers at 0, 1, 2**31, 2**63-1, 2**64-1 and
    strings from empty to several MiB with control characters, NUL, newlines and bidi overrides: each answered
    with an expected status, `GetStatus` keeps answering another caller, and the log stays one line per event."""
    channel = grpc.insecure_channel(daemon.address)
    stub = pb_grpc.SummariesStub(channel)

    def call(method: object, request: object) -> None:
        try:
            result = method(request, timeout=30)  # type: ignore[operator]
            if not isinstance(result, Message):  # a Write stream's acks; the unary calls answer one message
                for _ in result:
                    pass
        except grpc.RpcError as exc:
            assert exc.code() in EXPECTED, (exc.code(), exc.details())
            assert exc.details() and "\n" not in exc.details()

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(
        session_id=session_ids,
        run=texts,
        worker=texts,
        world_size=UINT32,
        next_sequence=UINT64,
        pid=INT64,
        host=texts,
        framework=texts,
        version=texts,
        first=UINT64,
        events=st.integers(min_value=0, max_value=3),
        path=texts,
        content=st.sampled_from([b"", b"x", b"\x00" * 4096]),
    )
    def extremes(
        session_id: str,
        run: str,
        worker: str,
        world_size: int,
        next_sequence: int,
        pid: int,
        host: str,
        framework: str,
        version: str,
        first: int,
        events: int,
        path: str,
        content: bytes,
    ) -> None:
        identity = pb.ClientIdentity(host=host, pid=pid, framework=framework, version=version)
        call(
            stub.OpenSession,
            pb.OpenSessionRequest(
                session_id=session_id,
                run=run,
                worker=worker,
                world_size=world_size,
                client=identity,
                next_sequence=next_sequence,
            ),
        )
        batch = pb.WriteRequest(session_id=session_id, first_sequence=first, events=[scalar(i) for i in range(events)])
        call(stub.Write, iter([batch]))
        call(stub.Flush, pb.FlushRequest(session_id=session_id, durable=True))
        call(stub.PutFile, pb.PutFileRequest(session_id=session_id, path=path, content=content))
        call(stub.CloseSession, pb.CloseSessionRequest(session_id=session_id))
        assert status(daemon.address).logdir  # another caller, with gRPC's default message limits

    try:
        extremes()
    finally:
        channel.close()
    assert daemon.proc.poll() is None, daemon.log()
    assert status(daemon.address).version
    assert_one_line_per_event(daemon.log())
