"""The sender's parts, each on its own: the ledger, the batch log, the spiller, and the whole sender over an
in-process fake transport (`FakeDaemon` below: a daemon's bookkeeping in memory, no gRPC, no process), so that
acknowledgements, refusals, reconnects and overflow are driven exactly and fast. The real daemon, real gRPC
and real faults are the business of the `test_faults_*` files."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from tensorboard.compat.proto.event_pb2 import Event

from summaryd.client._options import ClientOptions
from summaryd.client._sender import Sender, _loop
from summaryd.client._sender._batch_fit import DaemonLimits
from summaryd.client._sender._batch_log import BatchLog
from summaryd.client._sender._columns import ScalarRun
from summaryd.client._sender._core import SenderCore
from summaryd.client._sender._encoder import EventEncoder
from summaryd.client._sender._items import FAST_ITEM_BYTES
from summaryd.client._sender._kinds import SCALAR, SOURCE
from summaryd.client._sender._ledger import DELIVERED, Ledger
from summaryd.client._sender._queue import EventQueue
from summaryd.client._sender._spiller import Spiller
from summaryd.client._sender._status import Status
from summaryd.client._sender._transport import Ack, Hello, Opened, TransportError
from summaryd.client._spool import SpoolIdentity
from summaryd.v1 import summaryd_pb2 as pb

# ---- a daemon in memory, and the transport to it ------------------------------------------------------------


class FakeDaemon:
    """What a daemon remembers of one session: the events it wrote by sequence number (a resend of what it
    holds is dropped, as the real daemon does). `away` refuses to open sessions; `refuse` names an event it
    refuses (INVALID_ARGUMENT with the refused-sequence); `hold_acks` writes without acknowledging;
    `lose_writes` never receives what is sent (a connection that breaks before it arrives)."""

    def __init__(self) -> None:
        self.written: dict[int, bytes] = {}
        self.last = 0
        self.away = False
        self.refuse: int | None = None
        self.hold_acks = False
        self.lose_writes = False
        self.sessions_opened = 0
        self.closed = False
        self.streams: list[FakeStream] = []
        self.columns = False  # takes scalar columns (what it says when a session opens)
        self.max_batch_events = 0  # the most events it takes in one batch (0: not stated)
        self.column_batches = 0
        self.durable_acks = False  # a daemon on a bucket: its acks say how far the events are uploaded
        self.durable = 0
        self.forgot_session = False  # it lost its state: calls on the session fail until it is opened again

    def events(self) -> list[bytes]:
        return [self.written[s] for s in sorted(self.written)]


class FakeOpening:
    def __init__(self, answer: Opened | None, error: TransportError | None) -> None:
        self._answer, self._error = answer, error

    def done(self) -> bool:
        return True

    def result(self) -> Opened | None:
        if self._error is not None:
            raise self._error
        return self._answer

    def cancel(self) -> None:
        pass


class FakeStream:
    def __init__(self, daemon: FakeDaemon, on_ack: Callable[[Ack], None], on_end: Callable[..., None]) -> None:
        self._daemon, self._on_ack, self._on_end = daemon, on_ack, on_end
        self.ended = False
        self.failed = False
        self.writes: list[tuple[int, int]] = []

    def write(self, first_sequence: int, events: Sequence[bytes]) -> None:
        daemon = self._daemon
        if self.ended or daemon.lose_writes:
            return
        self.writes.append((first_sequence, len(events)))
        refused = daemon.refuse
        if refused is not None and first_sequence <= refused < first_sequence + len(events):
            daemon.refuse = None  # the bad event is refused once: the sender drops it
            self._end(TransportError("refused", "INVALID_ARGUMENT: bad event", refused_sequence=refused))
            return
        for offset, event in enumerate(events):
            sequence = first_sequence + offset
            if sequence == daemon.last + 1:
                daemon.written[sequence] = event
                daemon.last = sequence
        if not daemon.hold_acks:
            self._on_ack(Ack(daemon.last, daemon.durable))

    def write_scalars(self, first_sequence: int, scalars: ScalarRun, fixed_steps: bool = False) -> None:
        """The real daemon builds exactly `scalars.encoded()` (test_scalar_columns shows it)."""
        self._daemon.column_batches += 1
        self.write(first_sequence, scalars.encoded())

    def heartbeat(self) -> None:
        if self._daemon.durable_acks:  # the heartbeat's ack tells of uploads since the last batch
            self._on_ack(Ack(self._daemon.last, self._daemon.durable))

    def _end(self, error: TransportError | None) -> None:
        self.ended, self.failed = True, error is not None
        self._on_end(error)

    def cut(self) -> None:
        """The connection breaks (the daemon restarts, say): the stream ends with UNAVAILABLE."""
        self._end(TransportError("away", "UNAVAILABLE: connection reset"))

    def cancel(self) -> None:
        if not self.ended:
            self._end(TransportError("cancelled", "CANCELLED: cancelled"))

    def close(self, *, cancel: bool, timeout: float) -> None:
        if not self.ended:
            self._end(None)


class FakeTransport:
    address = "fake:1"

    def __init__(self, daemon: FakeDaemon) -> None:
        self._daemon = daemon

    def open_session(self, hello: Hello, on_done: Callable[[], None]) -> FakeOpening:
        daemon = self._daemon
        if daemon.away:
            return FakeOpening(None, TransportError("away", "UNAVAILABLE: connection refused"))
        daemon.sessions_opened += 1
        daemon.forgot_session = False
        limits = DaemonLimits(max_batch_events=daemon.max_batch_events, takes_scalar_columns=daemon.columns)
        return FakeOpening(Opened("run", daemon.last, 0, limits, durable_acks=daemon.durable_acks), None)

    def open_stream(
        self, session_id: str, on_ack: Callable[[Ack], None], on_end: Callable[[TransportError | None], None]
    ) -> FakeStream:
        stream = FakeStream(self._daemon, on_ack, on_end)
        self._daemon.streams.append(stream)
        return stream

    def close_session(self, session_id: str, timeout: float, stop: Callable[[float], bool]) -> bool:
        self._daemon.closed = True
        return True

    def flush(self, session_id: str, timeout: float) -> int:
        daemon = self._daemon
        if daemon.away:
            raise TransportError("away", "UNAVAILABLE: connection refused")
        if daemon.forgot_session:
            raise TransportError("failed", f"NOT_FOUND: unknown session {session_id}")
        if daemon.durable_acks:
            daemon.durable = daemon.last  # a durable flush uploads what is staged
        return daemon.last

    def close(self) -> None:
        pass

    def leave_to_parent(self) -> None:
        pass


def options(tmp_path: Path, **overrides: Any) -> ClientOptions:
    settings: dict[str, Any] = {"backoff_secs": (0.01, 0.05), "linger_secs": 0.0, "close_timeout": 30.0}
    settings.update(overrides)
    return ClientOptions.make(address="fake:1", spool_dir=tmp_path / "spool", environ={}, **settings)


@pytest.fixture
def fake() -> FakeDaemon:
    return FakeDaemon()


@pytest.fixture
def make_sender(tmp_path: Path, fake: FakeDaemon) -> Iterator[Callable[..., Sender]]:
    made: list[Sender] = []

    def make(**overrides: Any) -> Sender:
        sender = Sender("run", options=options(tmp_path, **overrides), transport=lambda _: FakeTransport(fake))
        made.append(sender)
        return sender

    yield make
    for sender in made:
        sender.close(timeout=5)


def event(i: int) -> bytes:
    return b"event-%05d" % i


# ---- the ledger -----------------------------------------------------------------------------------------------


def test_the_ledger_settles_by_reason_and_reports() -> None:
    queue = EventQueue()
    ledger = Ledger(queue)
    for i in range(10):
        queue.append((SOURCE, event(i), 10))
    ledger.settle(4, DELIVERED)
    ledger.settle(2, "encode_error")
    ledger.spool(3)
    ledger.settle(1, DELIVERED, spooled=True)
    ledger.refuse("closed")  # offered after close: counted, never accepted
    report = ledger.report(synced=False, error="UNAVAILABLE: away", spool_path="/spool/x")
    assert (report.delivered, report.undelivered, report.spooled) == (5, 3, 2)
    assert report.dropped == {"encode_error": 2, "closed": 1}
    assert report.spool_path == "/spool/x" and report.error == "UNAVAILABLE: away" and not report.ok
    ledger.settle(2, "timeout", spooled=True)
    ledger.settle(1, DELIVERED)
    report = ledger.report(synced=True, error=None, spool_path="/spool/x")
    assert report.undelivered == 0 and report.spooled == 0 and report.spool_path is None


# ---- the batch log --------------------------------------------------------------------------------------------


def test_a_caller_calls_in_only_at_the_first_event_a_sleeping_sender_waits_for_a_full_batch_or_past_its_room() -> None:
    """`alert`, the one count a caller compares the queue's length with after its lock-free append."""
    queue = EventQueue()
    assert queue.alert == 0, "no sender thread yet: every caller calls in"
    queue.open_fast(64 * FAST_ITEM_BYTES, accepting=True)
    assert queue.alert == 65, "awake: only past the room of 64 small events"
    assert queue.arm(full=10) and queue.alert == 1, "asleep on an empty queue: the first event wakes it"
    queue.inbox.append(scalar(0))
    queue.disarm()
    assert queue.alert == 65
    assert queue.arm(full=10) and queue.alert == 10, "lingering on one: a full batch wakes it"
    queue.inbox.extend(scalar(i) for i in range(1, 12))
    assert queue.arm(full=10) and queue.alert == 65, "a full batch waits already: no caller can help it"
    queue.open_fast(8 * FAST_ITEM_BYTES, accepting=True)
    assert queue.alert == queue.fast_until + 1 <= len(queue) + 9, "the room is counted from what is queued"
    queue.stop_taking()
    assert queue.alert <= 1 and queue.inbox is not queue.items, "closed: every caller calls in, to its own inbox"


def test_an_event_is_taken_back_from_the_end_of_a_long_queue_and_the_others_keep_their_order() -> None:
    queue = EventQueue()
    for i in range(10_000):
        queue.append(scalar(i))
    late = scalar(10_000)
    queue.inbox.append(late)
    queue.inbox.extend(scalar(i) for i in range(10_001, 10_010))  # other callers' events after it
    assert queue.take_back(late) and not queue.take_back(late)
    assert list(queue.items) == [scalar(i) for i in range(10_010) if i != 10_000]
    assert queue.take_back(scalar(3)), "an old one too, by a look at all of them"
    queue.stop_taking()
    closed = scalar(20_000)
    queue.inbox.append(closed)
    assert queue.take_back(closed) and len(queue.inbox) == 0 and len(queue) == 10_008


def test_the_batch_log_numbers_without_gaps_and_settles_acks_inside_a_batch() -> None:
    ledger = Ledger(EventQueue())
    log = BatchLog(ledger)
    first = log.append([event(1), event(2), event(3)], 30)
    second = log.append([event(4), event(5)], 20)
    assert (first.first, first.last, second.first, second.last, log.next_sequence) == (1, 3, 4, 5, 6)
    assert log.acknowledge(2)  # inside the first batch
    assert ledger.delivered == 2 and len(log) == 2 and log.held_events == 3
    assert not log.acknowledge(1), "an old ack is old news"
    assert log.acknowledge(5)
    assert ledger.delivered == 5 and len(log) == 0 and log.held_bytes == 0 and log.held_events == 0


def test_from_a_daemon_on_a_bucket_batches_are_kept_until_durable_and_resent_to_a_daemon_with_less() -> None:
    ledger = Ledger(EventQueue())
    log = BatchLog(ledger)
    log.resumed(0, durable_acks=True)
    batches = [log.append([event(2 * i + 1), event(2 * i + 2)], 20) for i in range(3)]  # 1-2, 3-4, 5-6
    assert log.acknowledge(6, durable=2)  # all staged, the first batch uploaded
    assert ledger.delivered == 6 and len(log) == 0 and log.kept_bytes == 40 and log.resume_from == 3
    assert log.acknowledge(6, durable=4) is False and log.kept_bytes == 20  # old news, but durable moved
    log.resumed(4, durable_acks=True)  # another daemon holds 1..4 (from the bucket): 5-6 go again
    assert list(log) == [batches[2]] and log.acked == 4 and log.held_events == 2
    assert log.next_to_send(window=2) is batches[2]
    assert log.acknowledge(6, durable=6)
    assert ledger.delivered == 6, "resent events are counted once"
    assert len(log) == 0 and log.kept_bytes == 0 and log.held_bytes == 0 and log.held_events == 0


def test_a_daemon_on_a_local_disk_settles_batches_at_the_ack() -> None:
    log = BatchLog(Ledger(EventQueue()))
    log.resumed(0, durable_acks=False)
    log.append([event(1)], 10)
    assert log.acknowledge(1) and log.kept_bytes == 0 and log.resume_from == 2


def test_the_in_flight_window_and_a_new_stream_resend_everything_unacknowledged() -> None:
    log = BatchLog(Ledger(EventQueue()))
    batches = [log.append([event(i)], 10) for i in range(1, 5)]
    sent = []
    while (batch := log.next_to_send(window=2)) is not None:
        log.sent(batch)
        sent.append(batch)
    assert sent == batches[:2], "at most two in flight"
    log.acknowledge(1)
    assert log.next_to_send(window=2) is batches[2]
    log.new_stream()  # a reconnect: what was in flight is sent again, oldest first
    assert log.next_to_send(window=2) is batches[1]


def test_a_refused_event_named_by_the_daemon_is_dropped_alone_and_the_rest_renumbered() -> None:
    ledger = Ledger(EventQueue())
    log = BatchLog(ledger)
    log.append([event(1), event(2), event(3)], 30)
    log.append([event(4)], 10)
    log.acknowledge(1)
    assert log.refuse(2) == (1, True)
    head = log.head
    assert head is not None and head.events == [event(3)] and head.first == 2
    assert [(b.first, b.count) for b in log] == [(2, 1), (3, 1)] and log.next_sequence == 4
    assert ledger.dropped == {"rejected": 1} and ledger.delivered == 1 and log.held_events == 2


def test_a_refusal_that_names_no_event_drops_the_oldest_batch() -> None:
    ledger = Ledger(EventQueue())
    log = BatchLog(ledger)
    log.append([event(1), event(2)], 20)
    log.append([event(3)], 10)
    assert log.refuse(None) == (2, False)
    assert [(b.first, b.count) for b in log] == [(1, 1)] and ledger.dropped == {"rejected": 2}
    assert log.drop_all("rejected") == 1 and ledger.dropped == {"rejected": 3}


# ---- the spiller ------------------------------------------------------------------------------------------------


def spiller_parts(tmp_path: Path, **overrides: Any) -> tuple[Spiller, BatchLog, Ledger, EventQueue, Status]:
    identity = SpoolIdentity("session-1", "run", "", 1, "fake:1", "test", session_started=1.0)
    core = SenderCore.make(options(tmp_path, **overrides), identity)
    return Spiller(core), core.batches, core.ledger, core.queue, core.status


def test_spilled_batches_are_read_back_and_the_spool_goes_once_acknowledged(tmp_path: Path) -> None:
    spiller, log, ledger, _, status = spiller_parts(tmp_path)
    first = log.append([event(1), event(2)], 20)
    second = log.append([event(3)], 10)
    status.spill_everything()
    spiller.spill(everything=False, number=lambda: None)
    assert first.events is None and second.events is None and first.span is not None
    assert ledger.spooled == 3 and log.held_bytes == 0 and spiller.path is not None
    assert spiller.read(first.span) == [event(1), event(2)]
    log.acknowledge(1)  # one event of the spilled batch delivered
    spiller.load_all()  # as a refusal does: back into memory, from the first unacknowledged event
    assert first.events == [event(2)] and first.first == 2 and second.events == [event(3)]
    assert ledger.spooled == 0 and spiller.path is None and not (tmp_path / "spool" / "session-1").exists()


def test_a_spool_left_unacknowledged_is_kept_and_an_acknowledged_one_removed(tmp_path: Path) -> None:
    spiller, log, _, _, _ = spiller_parts(tmp_path)
    batch = log.append([event(1)], 10)
    assert spiller.spill_batch(batch)
    directory = tmp_path / "spool" / "session-1"
    spiller.discard_when_acknowledged()
    assert directory.is_dir(), "still holds an unacknowledged event"
    log.acknowledge(1)
    spiller.discard_when_acknowledged()
    assert not directory.exists() and spiller.path is None


def test_nothing_is_spilled_while_the_daemon_keeps_up(tmp_path: Path) -> None:
    spiller, log, ledger, _, _ = spiller_parts(tmp_path, spool_after=3600.0)
    batch = log.append([event(1)], 10)
    spiller.spill(everything=False, number=lambda: None)
    assert batch.events == [event(1)] and ledger.spooled == 0 and spiller.path is None


# ---- the whole sender over the fake transport ------------------------------------------------------------------


def test_every_event_is_delivered_once_in_order(make_sender: Callable[..., Sender], fake: FakeDaemon) -> None:
    sender = make_sender(max_batch_events=7)
    for i in range(1, 101):
        assert sender.submit(event(i), 12)
    report = sender.close()
    assert report.ok and report.synced and report.delivered == 100
    assert fake.events() == [event(i) for i in range(1, 101)] and fake.closed


def test_a_reconnect_resends_what_was_not_acknowledged_and_nothing_twice(
    make_sender: Callable[..., Sender], fake: FakeDaemon
) -> None:
    sender = make_sender(max_batch_events=5)
    fake.hold_acks = True  # the first five written, not acknowledged: the daemon drops them when resent
    for i in range(1, 6):
        sender.submit(event(i), 12)
    while fake.last < 5:
        sender.flush(timeout=0.05)
    fake.lose_writes = True  # the next five never arrive: they must be sent again after the reconnect
    for i in range(6, 11):
        sender.submit(event(i), 12)
    assert sender.flush(timeout=0.5).delivered == 0
    fake.hold_acks = fake.lose_writes = False
    fake.streams[-1].cut()
    report = sender.flush(timeout=30)
    assert report.delivered == 10 and report.undelivered == 0
    assert fake.sessions_opened >= 2 and fake.events() == [event(i) for i in range(1, 11)]
    assert sender.close().ok


def test_a_refused_event_is_dropped_and_the_rest_delivered_without_a_gap(
    make_sender: Callable[..., Sender], fake: FakeDaemon
) -> None:
    fake.refuse = 4
    sender = make_sender(max_batch_events=3)
    for i in range(1, 11):
        sender.submit(event(i), 12)
    report = sender.close()
    assert report.delivered == 9 and report.dropped == {"rejected": 1} and report.undelivered == 0
    assert fake.events() == [event(i) for i in range(1, 11) if i != 4]
    assert sorted(fake.written) == list(range(1, 10)), "renumbered on from the last acknowledged event"


def test_events_spilled_while_the_daemon_is_away_are_sent_when_it_returns(
    make_sender: Callable[..., Sender], fake: FakeDaemon, tmp_path: Path
) -> None:
    fake.away = True
    sender = make_sender(spool_after=0.0, max_batch_events=4)
    for i in range(1, 21):
        sender.submit(event(i), 12)
    while sender.report().spooled < 20:  # the sender thread spills all of it (bounded by the test's timeout)
        sender.flush(timeout=0.05)
    assert sender.report().spool_path is not None
    fake.away = False
    report = sender.close()
    assert report.ok and report.delivered == 20 and report.spooled == 0 and report.spool_path is None
    assert fake.events() == [event(i) for i in range(1, 21)]
    assert not any((tmp_path / "spool").iterdir()), "a spool the daemon acknowledged whole is removed"


def test_drop_oldest_makes_room_and_counts_it(make_sender: Callable[..., Sender], fake: FakeDaemon) -> None:
    fake.away = True  # nothing leaves the queue
    sender = make_sender(overflow="drop_oldest", spool=False, max_queue_bytes=100)
    assert all(sender.submit(event(i), 10) for i in range(1, 16))
    report = sender.close(timeout=0.2)
    assert report.dropped == {"queue_full": 5, "timeout": 10} and report.delivered == 0
    assert report.error is not None and "UNAVAILABLE" in report.error


def test_block_waits_then_drops_the_new_event(make_sender: Callable[..., Sender], fake: FakeDaemon) -> None:
    fake.away = True
    sender = make_sender(overflow="block", block_secs=0.1, spool=False, max_queue_bytes=100)
    assert all(sender.submit(event(i), 10) for i in range(1, 11))
    assert not sender.submit(event(11), 10), "no room came within block_secs"
    report = sender.close(timeout=0.2)
    assert report.dropped == {"queue_full": 1, "timeout": 10}


def test_batches_kept_until_durable_fill_the_memory_bound_until_uploaded(
    make_sender: Callable[..., Sender], fake: FakeDaemon
) -> None:
    fake.durable_acks = True  # a daemon on a bucket that has uploaded nothing yet
    # Room for ten events of 11 bytes (each submitted as 10) and not one more.
    sender = make_sender(overflow="block", block_secs=1.0, spool=False, max_queue_bytes=115, heartbeat_secs=0.05)
    assert all(sender.submit(event(i), 10) for i in range(1, 11))
    assert sender.flush(timeout=5).delivered == 10  # acknowledged, and kept until durable: the memory is full
    assert not sender.submit(event(11), 10), "kept batches hold their memory until the daemon uploads them"
    fake.durable = fake.last  # uploaded: the next (heartbeat's) ack says so and the kept batches go
    assert sender.submit(event(12), 10)
    report = sender.close()
    assert report.delivered == 11 and report.dropped == {"queue_full": 1}


def test_spill_policy_keeps_the_caller_going_and_loses_nothing(
    make_sender: Callable[..., Sender], fake: FakeDaemon
) -> None:
    fake.away = True
    sender = make_sender(overflow="spill", max_queue_bytes=100, spool_after=3600.0)
    assert all(sender.submit(event(i), 10) for i in range(1, 51))
    fake.away = False
    report = sender.close()
    assert report.ok and report.delivered == 50 and fake.events() == [event(i) for i in range(1, 51)]


def test_a_permanent_refusal_gives_up_and_says_why(make_sender: Callable[..., Sender], tmp_path: Path) -> None:
    class Denied(FakeTransport):
        def open_session(self, hello: Hello, on_done: Callable[[], None]) -> FakeOpening:
            return FakeOpening(None, TransportError("denied", "PERMISSION_DENIED: not your run"))

    sender = Sender("run", options=options(tmp_path), transport=lambda _: Denied(FakeDaemon()))
    sender.submit(event(1), 10)
    report = sender.flush(timeout=30)
    assert report.error == "PERMISSION_DENIED: not your run" and report.dropped == {"rejected": 1}
    assert not sender.submit(event(2), 10)
    assert sender.close().dropped == {"rejected": 2}


def test_options_and_settings_are_not_given_together(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="either options or the settings"):
        Sender("run", options=options(tmp_path), max_queue_bytes=10)


# ---- the options -----------------------------------------------------------------------------------------------


def test_options_are_made_once_from_arguments_then_the_environment(tmp_path: Path) -> None:
    environ = {
        "SUMMARYD_ADDRESS": "daemon-host",
        "SUMMARYD_TOKEN": "from-the-environment",
        "SUMMARYD_SPOOL_DIR": str(tmp_path / "env-spool"),
    }
    made = ClientOptions.make(environ=environ)
    assert made.addresses == ("daemon-host:6065",) and made.address == "daemon-host:6065"
    assert made.channel.token == "from-the-environment" and made.spool_root == tmp_path / "env-spool"
    given = ClientOptions.make(address="[::1]:7000", token="given", spool_dir=tmp_path / "mine", environ=environ)
    assert given.addresses == ("[::1]:7000",) and given.channel.token == "given"
    assert given.spool_root == tmp_path / "mine"
    assert ClientOptions.make(spool=False, environ={}).overflow == "drop_oldest", "nowhere to spill to"
    with pytest.raises(ValueError, match="choose one of spill, drop_oldest, block"):
        ClientOptions.make(overflow="never", environ={})


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("max_queue_bytes", -5),
        ("max_queue_bytes", 0),
        ("max_batch_events", 0),
        ("max_batch_bytes", 1.5),
        ("max_in_flight", 0),
        ("linger_secs", -0.1),
        ("rpc_timeout", 0),
        ("heartbeat_secs", float("nan")),
        ("close_timeout", -1),
        ("spool_after", -1),
        ("block_secs", -1),
        ("backoff_secs", (2.0, 0.05)),
        ("backoff_secs", (0, 1.0)),
    ],
)
def test_a_bad_setting_is_refused_naming_the_argument(argument: str, value: object) -> None:
    """As the daemon's flags: the writer refuses a bound out of range at once, not with odd behaviour later."""
    from summaryd.client import SummaryWriter

    with pytest.raises(ValueError, match=f"^{argument}="):
        ClientOptions.make(environ={}, **{argument: value})
    with pytest.raises(ValueError, match=f"^{argument}="):
        SummaryWriter("run", address="127.0.0.1:1", spool=False, **{argument: value})


def test_an_unknown_setting_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="max_queue_byte"):
        ClientOptions.make(environ={}, max_queue_byte=5)


def test_a_writer_hands_its_one_options_object_to_every_sender(tmp_path: Path) -> None:
    from summaryd.client import SummaryWriter

    writer = SummaryWriter("run", address="127.0.0.1:1", worker="", token="t0k3n", spool=False, close_timeout=0)
    try:
        sub = writer._sub_sender("sub")
        assert sub.options is writer.sender.options and writer.sender.options.channel.token == "t0k3n"
    finally:
        writer.close(timeout=0)


# ---- scalars as columns ---------------------------------------------------------------------------------------


def scalar(i: int) -> tuple[int, str, float, int, float, int]:
    return (SCALAR, f"tag{i % 3}", i * 0.5, i, 1_700_000_000.0 + i, 30)


def logged(sender: Sender, count: int) -> list[bytes]:
    """Every fifth event serialized, the others scalars; what the daemon must end up holding, in order."""
    encoder, expected = EventEncoder(), []
    for i in range(1, count + 1):
        if i % 5 == 0:
            assert sender.submit(event(i), 12)
            expected.append(event(i))
        else:
            assert sender.enqueue(scalar(i))
            expected.append(encoder.scalar(scalar(i)))
    return expected


def test_scalars_go_as_columns_and_keep_their_place_among_other_events(
    make_sender: Callable[..., Sender], fake: FakeDaemon
) -> None:
    fake.columns = True
    sender = make_sender(max_batch_events=7)
    sender.submit(event(0), 12)
    while sender.report().delivered < 1:  # the session is open: the sender knows the daemon takes columns
        sender.flush(timeout=0.05)
    expected = logged(sender, 100)
    report = sender.close()
    assert report.ok and report.delivered == 101
    assert fake.events() == [event(0), *expected]
    assert fake.column_batches >= 20


def test_a_refused_scalar_of_a_column_batch_is_dropped_alone(
    make_sender: Callable[..., Sender], fake: FakeDaemon
) -> None:
    fake.columns = True
    sender = make_sender(max_batch_events=50)
    sender.submit(event(0), 12)
    while sender.report().delivered < 1:
        sender.flush(timeout=0.05)
    fake.refuse = 4  # the third scalar, in the first column batch
    expected = logged(sender, 30)
    report = sender.close()
    assert report.delivered == 30 and report.dropped == {"rejected": 1} and report.undelivered == 0
    assert fake.events() == [event(0), *(e for i, e in enumerate(expected, 1) if i != 3)]
    assert fake.column_batches


def test_column_batches_spilled_reach_the_daemon_from_the_spool(
    make_sender: Callable[..., Sender], fake: FakeDaemon
) -> None:
    fake.columns = True
    sender = make_sender(spool_after=0.0, max_batch_events=4)
    sender.submit(event(0), 12)
    while sender.report().delivered < 1:
        sender.flush(timeout=0.05)
    fake.hold_acks = fake.lose_writes = True  # nothing arrives: what was numbered as columns goes to the spool
    expected = logged(sender, 40)
    while sender.report().spooled < 40:
        sender.flush(timeout=0.05)
    fake.hold_acks = fake.lose_writes = False
    fake.streams[-1].cut()
    report = sender.close()
    assert report.ok and report.delivered == 41 and report.spooled == 0
    assert fake.events() == [event(0), *expected]


# ---- the caller's lock-free append, raced ------------------------------------------------------------------------
# Small events are appended without the lock while the memory bound leaves room (`EventQueue`). A tiny switch
# interval makes the GIL change threads between nearly any two bytecodes, so that the races are run, not assumed.


@pytest.fixture
def switching() -> Iterator[None]:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


def _log_from_threads(
    sender: Sender, threads: int, calls: int, during: Callable[[], None], after: int = 0, refused: int = 0
) -> list[list[bool]]:
    """`threads` threads each enqueue `calls` scalars of their own tag while `during()` runs on this thread (and
    on until `refused` of them were refused: however the threads are scheduled, `during` then ran while they
    logged), and `after` more once it returned; what each call returned."""
    outcomes: list[list[bool]] = [[] for _ in range(threads)]
    begun = threading.Barrier(threads + 1)
    returned = threading.Event()

    def log(which: int) -> None:
        begun.wait()
        out = outcomes[which]
        step = refusals = 0
        while step < calls or refusals < refused:
            accepted = sender.enqueue((SCALAR, f"thread-{which}", 0.5, step, 1.0, 32))
            out.append(accepted)
            refusals += not accepted
            step += 1
        if after:
            returned.wait()
            for step in range(calls, calls + after):
                out.append(sender.enqueue((SCALAR, f"thread-{which}", 0.5, step, 1.0, 32)))

    workers = [threading.Thread(target=log, args=(which,)) for which in range(threads)]
    for worker in workers:
        worker.start()
    begun.wait()
    while not any(outcomes):  # the threads are logging before `during` starts
        threading.Event().wait(0.001)
    during()
    returned.set()
    for worker in workers:
        worker.join()
    return outcomes


def _delivered_steps(fake: FakeDaemon) -> dict[str, list[int]]:
    steps: dict[str, list[int]] = {}
    for data in fake.events():
        event = Event.FromString(data)
        steps.setdefault(event.summary.value[0].tag, []).append(event.step)
    return steps


def _accepted_steps(outcomes: list[list[bool]]) -> dict[str, list[int]]:
    return {f"thread-{which}": [s for s, ok in enumerate(out) if ok] for which, out in enumerate(outcomes) if any(out)}


@pytest.mark.parametrize("columns", [True, False])
def test_threads_logging_while_close_runs_have_every_event_counted_once(
    make_sender: Callable[..., Sender], fake: FakeDaemon, switching: None, columns: bool
) -> None:
    fake.columns = columns
    sender = make_sender(max_batch_events=64)
    outcomes = _log_from_threads(sender, 4, 5000, sender.close, refused=100)
    accepted, refused = sum(map(sum, outcomes)), sum(len(out) - sum(out) for out in outcomes)
    assert accepted and refused >= 400, "the close ran while the threads logged"
    report = sender.report()  # after every thread ended: the events appended after close() returned count too
    assert report.delivered == accepted and report.undelivered == 0
    assert report.dropped == {"closed": refused}
    assert _delivered_steps(fake) == _accepted_steps(outcomes), "each accepted event delivered once, in order"


def test_events_logged_across_close_go_to_the_successor_or_are_counted_refused(
    make_sender: Callable[..., Sender], fake: FakeDaemon, tmp_path: Path, switching: None
) -> None:
    sender = make_sender()
    other = FakeDaemon()
    successor = Sender("run", options=options(tmp_path), transport=lambda _: FakeTransport(other))
    sender.hand_over_after_close(lambda: successor)
    # Some of each thread's events are logged after close() returned, whenever the threads' first 5,000 end.
    outcomes = _log_from_threads(sender, 3, 5000, sender.close, after=200)
    later = successor.close()
    report = sender.report()
    total = sum(map(len, outcomes))
    assert report.undelivered == 0 and later.undelivered == 0
    assert report.delivered + later.delivered + report.dropped.get("closed", 0) == total
    assert sum(map(sum, outcomes)) == report.delivered + later.delivered
    assert later.delivered, "events logged after close() returned went to the successor"
    assert len(fake.events()) == report.delivered and len(other.events()) == later.delivered


def test_flush_waits_for_every_event_appended_before_it_while_others_log(
    make_sender: Callable[..., Sender], fake: FakeDaemon, switching: None
) -> None:
    fake.columns = True
    sender = make_sender(max_batch_events=64)
    mine = 0

    def flush_rounds() -> None:
        nonlocal mine
        for _ in range(20):
            for _ in range(300):
                assert sender.enqueue((SCALAR, "main", 0.5, mine, 1.0, 32))
                mine += 1
            sender.flush(timeout=30)
            assert len(_delivered_steps(fake)["main"]) == mine

    outcomes = _log_from_threads(sender, 2, 20000, flush_rounds)
    report = sender.close()
    assert report.delivered == mine + sum(map(sum, outcomes)) and report.undelivered == 0


def test_the_memory_bound_holds_exactly_for_events_appended_without_the_lock(
    make_sender: Callable[..., Sender], fake: FakeDaemon
) -> None:
    fake.away = True  # nothing leaves the queue
    # Room for 546 events of 30 bytes: the first ones are appended without the lock, the last ones under it.
    sender = make_sender(overflow="drop_oldest", spool=False, max_queue_bytes=16_384)
    assert all(sender.enqueue((SCALAR, "loss", 0.5, step, 1.0, 30)) for step in range(2000))
    report = sender.close(timeout=0.2)
    assert report.dropped == {"queue_full": 2000 - 546, "timeout": 546}


def _staged_not_uploaded(make_sender: Callable[..., Sender], fake: FakeDaemon) -> Sender:
    """A sender whose 10 events a daemon on a bucket acknowledged (staged) and has not uploaded."""
    fake.durable_acks = True
    sender = make_sender()
    for i in range(10):
        sender.submit(event(i), 12)
    sender.flush(timeout=30)
    assert len(fake.events()) == 10 and fake.durable == 0, "acknowledged, none uploaded"
    return sender


def test_events_kept_until_uploaded_are_sent_again_when_the_daemon_lost_them_before_the_close(
    make_sender: Callable[..., Sender], fake: FakeDaemon
) -> None:
    """A daemon on a bucket acknowledged the events (staged) and lost its disk before uploading them: the close
    finds them missing, resumes the session and sends them again, instead of closing over the gap."""
    sender = _staged_not_uploaded(make_sender, fake)
    fake.written.clear()
    fake.last, fake.forgot_session = 0, True  # its disk lost: nothing staged, the session unknown to it
    report = sender.close()
    assert report.delivered == 10 and report.undelivered == 0 and report.synced and not report.dropped
    assert fake.events() == [event(i) for i in range(10)], "sent again, once each"
    assert fake.sessions_opened == 2 and fake.durable == 10


def test_a_backed_up_queue_of_scalars_goes_in_larger_batches_up_to_what_the_daemon_takes(
    make_sender: Callable[..., Sender], fake: FakeDaemon
) -> None:
    fake.columns, fake.max_batch_events = True, 20
    sender = make_sender(max_batch_events=4, max_in_flight=1)
    assert sender.enqueue(scalar(0))
    sender.flush(timeout=30)
    fake.hold_acks = True  # one batch in flight, unacknowledged: the rest of the queue waits
    encoder = EventEncoder()
    assert all(sender.enqueue(scalar(i)) for i in range(1, 201))
    fake.hold_acks = False
    fake.streams[-1].cut()  # the stream reconnects; what waited is numbered now, in larger batches
    report = sender.close()
    assert report.delivered == 201 and report.undelivered == 0
    assert fake.events() == [encoder.scalar(scalar(i)) for i in range(201)]
    sizes = [count for stream in fake.streams for _, count in stream.writes]
    assert max(sizes) == 20, "a backed-up queue: batches of up to the daemon's most, not max_batch_events"


def test_a_run_of_scalars_is_cut_at_max_batch_bytes_and_the_rest_keeps_its_place(
    make_sender: Callable[..., Sender], fake: FakeDaemon
) -> None:
    fake.columns = True
    sender = make_sender(max_batch_bytes=70)  # two scalars of 30 bytes, and the one that crosses it
    sender.submit(event(0), 12)
    sender.flush(timeout=30)
    fake.hold_acks = fake.lose_writes = True  # nothing leaves until all of it is queued
    expected = logged(sender, 40)  # runs of four scalars, then a serialized event
    fake.hold_acks = fake.lose_writes = False
    fake.streams[-1].cut()
    report = sender.close()
    assert report.delivered == 41 and report.undelivered == 0
    assert fake.events() == [event(0), *expected]
    assert max(count for stream in fake.streams for _, count in stream.writes) <= 3


def test_scalars_numbered_while_the_daemon_is_away_wait_packed_and_arrive_unchanged(
    make_sender: Callable[..., Sender], fake: FakeDaemon
) -> None:
    fake.away, fake.columns = True, True  # no daemon answered yet: full batches are numbered as columns, packed
    sender = make_sender(max_batch_events=8)
    assert all(sender.enqueue(scalar(i)) for i in range(1, 41))
    fake.away = False
    # Delivered before closing: a sender closing while its last attempt to connect failed spools what waits (as
    # events), and this test is about what is sent live once the daemon answers.
    assert sender.flush(timeout=30).undelivered == 0
    report = sender.close()
    encoder = EventEncoder()
    assert report.delivered == 40 and report.undelivered == 0
    assert fake.events() == [encoder.scalar(scalar(i)) for i in range(1, 41)]
    assert fake.column_batches
    run = ScalarRun.of([scalar(i) for i in range(1, 9)])
    packed = run.packed()
    assert not isinstance(packed.values, list), "packed into arrays"
    assert packed.fill(pb.ScalarColumns()) == run.fill(pb.ScalarColumns()) and packed.encoded() == run.encoded()


# ---- what a framework's flush() after every step costs the sender thread ----------------------------------------


def test_flushes_in_a_fast_loop_share_one_message_per_flush_gap(
    make_sender: Callable[..., Sender], fake: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first flush's events leave at once; those of the flushes within the gap after it go together in one
    message (a framework flushing after each step of a fast loop), and close() sends them without waiting for
    the gap to end."""
    monkeypatch.setattr(_loop, "FLUSH_GAP_SECS", 30.0)  # a gap no run of this test outlasts
    sender = make_sender(linger_secs=60.0)
    sender.submit(event(0), 12)
    assert sender.flush(timeout=30).delivered == 1
    for i in range(1, 51):
        sender.submit(event(i), 12)
        assert sender.send_now().undelivered == i, "send_now() never waits"
        threading.Event().wait(0.002)  # a training step: the sender thread gets the GIL meanwhile
    assert len(fake.streams[-1].writes) == 1, "nothing more left within the gap"
    report = sender.close(timeout=30)
    assert report.delivered == 51 and fake.events() == [event(i) for i in range(51)]
    assert fake.streams[-1].writes == [(1, 1), (2, 50)], "the 50 flushes' events in one message"


def test_a_sender_waiting_for_the_daemon_wakes_on_its_reconnect_schedule(
    make_sender: Callable[..., Sender], fake: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Daemon away, events queued, flushed and spooled: their linger and the spool's due time long past, the
    sender thread wakes for its attempts to reconnect (`backoff_secs`), not every millisecond."""
    wakeups = [0]
    next_wakeup = _loop.SenderLoop._next_wakeup

    def counted(self: _loop.SenderLoop) -> float:
        wakeups[0] += 1
        return next_wakeup(self)

    monkeypatch.setattr(_loop.SenderLoop, "_next_wakeup", counted)
    fake.away = True
    sender = make_sender(backoff_secs=(0.05, 0.1), spool_after=0.1, linger_secs=0.01)
    for i in range(10):
        sender.submit(event(i), 12)
    sender.send_now()
    threading.Event().wait(1.0)
    # About 10 attempts in the second, and the wake-ups of the flush and the spill; polling would be ~1,000.
    assert wakeups[0] < 100, wakeups[0]
    fake.away = False
    assert sender.close(timeout=30).delivered == 10


@pytest.mark.parametrize("back", [False, True], ids=["away-past-the-deadline", "back-before-it"])
def test_events_kept_until_uploaded_count_delivered_only_once_uploaded_when_the_daemon_is_away_at_the_close(
    make_sender: Callable[..., Sender], fake: FakeDaemon, back: bool
) -> None:
    """A daemon on a bucket acknowledged the events (staged), uploaded none, and is away when the writer closes.
    Away until the close's deadline: the report counts them in the spool, not delivered (they were reported
    delivered, and lost with the daemon's disk). Back before it: they are sent again, uploaded, and counted
    delivered once."""
    sender = _staged_not_uploaded(make_sender, fake)
    fake.away = True
    fake.streams[-1].cut()
    if back:
        threading.Timer(0.5, setattr, (fake, "away", False)).start()
    report = sender.close(timeout=10.0 if back else 1.0)
    if back:
        assert report.delivered == 10 and report.undelivered == 0 and report.synced and not report.dropped, report
        assert fake.durable == 10
    else:
        assert report.delivered == 0 and report.undelivered == 10 and report.spooled == 10, report
        assert not report.synced and report.spool_path is not None and not report.dropped
