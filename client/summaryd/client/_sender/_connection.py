"""The session with the daemon over a `Transport`: opening (and resuming) it, the write stream, heartbeats,
and closing it."""

from __future__ import annotations

import time

from summaryd.client._sender._batch_fit import DaemonLimits
from summaryd.client._sender._core import SenderCore, SenderPart
from summaryd.client._sender._pacing import Pacing
from summaryd.client._sender._spiller import Spiller
from summaryd.client._sender._status import log
from summaryd.client._sender._transport import Ack, Hello, Opened, Opening, Stream, Transport, TransportError


class Connection(SenderPart):
    """Keeps one session and write stream open to the daemon and sends the batch log over it; acknowledgements
    settle the log. Sender thread only, but for `on_ack`/`on_end` (the stream's thread) and `flush`/`cancel`
    (the caller's)."""

    def __init__(self, core: SenderCore, transport: Transport, spiller: Spiller) -> None:
        super().__init__(core)
        options = core.options
        self._transport = transport
        self._spiller = spiller
        self._stream: Stream | None = None
        self._opening: Opening | None = None
        self._used = False  # a session was asked for: there is one to close
        self._next_attempt = 0.0
        self._backoff = options.backoff_secs[0]
        self.connect_failed = False
        self._redirected = False  # the last attempt to open the session was redirected to the run's owner
        self._lease = float("inf")
        self.limits = DaemonLimits()
        self.answered = False  # a daemon opened the session once: `limits` are its own
        self.resume_owed = False  # a close found kept events missing: the session is to be resumed first
        self._last_sent = 0.0
        self.run_dir: str | None = None
        self.pacing = Pacing(options)
        """The linger and in-flight window the daemon asks for, within the client's bounds."""

    @property
    def address(self) -> str:
        """The daemon of the moment (the transport's)."""
        return self._transport.address

    @property
    def streaming(self) -> bool:
        return self._stream is not None

    def poll(self) -> str | None:
        """Open (or resume) the session and a write stream without blocking this thread; the reason when the
        daemon refused it for good (then nothing can be delivered)."""
        if self._stream is not None and not self._stream.ended:
            return None
        if self._stream is not None:
            failed = self._stream.failed
            self.disconnect()
            if failed:  # a daemon that refuses writes (disk full) is not hammered with resends
                self._retry_later()
        if self._opening is not None:
            if not self._opening.done():
                return None
            opening, self._opening = self._opening, None
            try:
                answer = opening.result()
            except TransportError as exc:
                return self._open_failed(exc)
            if answer is not None:
                self._connected(answer)
            return None
        if time.monotonic() < self._next_attempt:
            return None
        self._used = True
        hello = Hello(self._identity, self._batches.resume_from)
        self._opening = self._transport.open_session(hello, self._wake.set)
        return None

    def _connected(self, answer: Opened) -> None:
        self.run_dir = answer.run_dir
        self._lease = answer.lease_seconds or float("inf")
        self.limits = answer.limits
        self.answered = True
        self.pacing.advise(*(answer.pacing or (0.0, 0)))  # another daemon's, or none: the client's own again
        with self._cond:
            lost = self._batches.resumed(answer.last_sequence, answer.durable_acks)
            self.resume_owed = False
        if lost:
            log.warning(
                "summaryd: the daemon at %s holds session %s of run %r only through sequence %d: %d events it "
                "had acknowledged are lost with its state; the session goes on from there",
                self._transport.address,
                self._identity.session_id,
                self._identity.run,
                answer.last_sequence,
                lost,
            )
        self.on_ack(Ack(answer.last_sequence, answer.durable_sequence))
        self._stream = self._transport.open_stream(self._identity.session_id, self.on_ack, self.on_end)
        with self._cond:
            self._batches.new_stream()
            overcome = self._status.overcome()  # not the error of what is now delivered
            spooled = self._ledger.spooled
        self._last_sent = time.monotonic()
        self.connect_failed = self._redirected = False
        if overcome and self._status.warnings.forget("daemon"):
            # The user was told the daemon was away: say it is back, and what becomes of the spool.
            sending = f"; sending the {spooled} spooled events" if spooled else ""
            log.warning(
                "summaryd: daemon at %s answers again for run %r%s",
                self._transport.address,
                self._identity.run,
                sending,
            )

    def _open_failed(self, exc: TransportError) -> str | None:
        self.report_error(exc)
        if exc.redirected and not self._redirected:
            # Sent on to the run's owner: open there at once (once in a row, so two daemons naming each other are
            # not asked without pause); the daemon is not away, and an upload waiting for the session waits on.
            self._redirected = True
            self._wake.set()
            return None
        self._redirected = False
        self.connect_failed = True
        if exc.permanent:
            return exc.text
        self._retry_later()
        return None

    def _retry_later(self) -> None:
        """Capped exponential backoff; it starts again from the bottom once the daemon acknowledges."""
        self._next_attempt = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self._options.backoff_secs[1])

    def report_error(self, exc: TransportError) -> None:
        with self._cond:
            self._status.note_error(exc.text, passing=exc.passing)
        if exc.kind == "away" and not exc.answered:
            log.debug("summaryd: daemon at %s: %s", self._transport.address, exc.text)
            self._status.warnings.warn("daemon", self._away_message())
            return
        # Say what becomes of the events, so that the line is not read as data lost.
        then = "; the events are kept and sent when it answers" if exc.passing else ""
        self._status.warnings.warn(
            "daemon", f"daemon at {self._transport.address} for run {self._identity.run!r}: {exc.text}{then}"
        )

    def _away_message(self) -> str:
        """What the user reads when the daemon does not answer: what to check, and where the events are."""
        options = self._options
        kept = f"run {self._identity.run!r} keeps its events in memory and sends them when it answers"
        if options.spool_enabled:
            spool = options.spool_root / self._identity.session_id
            kept += f"; after {options.spool_after:g}s they go to the spool {spool} (`summaryd replay` delivers it)"
        return f"no daemon answers at {self._transport.address}: is `summaryd serve` running there? {kept}"

    def on_ack(self, ack: Ack) -> None:
        """The stream's thread (and an opened session): settle every batch the daemon acknowledged."""
        if ack.pacing is not None:
            self.pacing.advise(*ack.pacing)
        with self._cond:
            if self._batches.acknowledge(ack.sequence, ack.durable):
                self._backoff = self._options.backoff_secs[0]
            self._cond.notify_all()
        self._wake.set()

    def on_end(self, error: TransportError | None) -> None:
        """The stream's thread: the stream ended; a refusal is handled on the sender thread."""
        if error is None or (error.kind == "cancelled" and self._abandon.is_set()):
            self._wake.set()
            return
        self.report_error(error)
        if error.kind == "refused":
            with self._cond:
                self._batches.note_refusal(error.details, error.refused_sequence)
        self._wake.set()

    def disconnect(self) -> None:
        if self._stream is not None:
            self._stream.close(cancel=True, timeout=1.0)
            self._stream = None
        with self._cond:
            self._batches.new_stream()

    def unreachable_while_closing(self) -> bool:
        return self._status.closing and self._stream is None and self.connect_failed

    def send_ready(self) -> None:
        """Send unsent batches of the log, oldest first, while the in-flight window has room."""
        stream = self._stream
        if stream is None or stream.ended:
            return
        session_id = self._identity.session_id
        while True:
            with self._cond:
                batch = self._batches.next_to_send(self.pacing.max_in_flight)
                if batch is None:
                    return
                events, span, first, nbytes = batch.events, batch.span, batch.first, batch.nbytes
                scalars = batch.scalars
                limits = self.limits
                fixed_steps = limits.takes_fixed_steps
                if scalars is not None and not (
                    limits.takes_scalar_columns and limits.carries_whole(batch.count, nbytes)
                ):
                    events, scalars = batch.encoded(), None  # an older daemon, or limits that cut the batch
            if scalars is not None:
                self._last_sent = time.monotonic()
                batch.sent(self._last_sent)
                stream.write_scalars(first, scalars, fixed_steps)
                with self._cond:
                    self._batches.sent(batch)
                continue
            if events is None:
                assert span is not None
                events = self._spiller.read(span)
            self._last_sent = time.monotonic()
            batch.sent(self._last_sent)
            # Cut again to the daemon's limits: a spooled batch, or one made before they shrank, may be over them.
            for part in self.limits.split(events, nbytes, session_id):
                stream.write(first, part)
                first += len(part)
            with self._cond:
                self._batches.sent(batch)

    def keep_alive(self) -> None:
        """Reconnect when an ack is overdue; send a heartbeat when the stream has been silent a while."""
        stream = self._stream
        if stream is None or stream.ended:
            return
        now = time.monotonic()
        timeout = self._options.rpc_timeout
        with self._cond:
            head = self._batches.oldest_in_flight()
            overdue = head is not None and now - head.sent_at > timeout
            if overdue:
                self._status.note_error(f"no acknowledgement within {timeout}s; reconnecting", passing=True)
        if overdue:
            stream.cancel()
        elif now - self._last_sent >= self._heartbeat_interval():
            self._last_sent = now
            stream.heartbeat()

    def _heartbeat_interval(self) -> float:
        return min(self._options.heartbeat_secs, self._lease / 3)

    def wait_hint(self, now: float) -> float:
        """Seconds until this connection has something to do (a heartbeat, another attempt to open)."""
        if self._stream is not None:
            return self._heartbeat_interval() - (now - self._last_sent)
        if self._opening is None:
            return self._next_attempt - now
        return float("inf")  # the opening wakes the thread when it is done

    def finish(self) -> bool:
        """After the last ack of a closing sender: end the stream and close the session (the daemon fsyncs).

        A close that meets a restarting daemon is tried again until `close()`'s deadline: the daemon knows
        the session from its store, and a close is harmless to repeat. False, with nothing closed, when events
        kept until uploaded (a bucket logdir) are not all there: the daemon lost them with its state, so the
        session is resumed (`resume_owed`), they are sent again, and the close is tried anew.
        """
        self._spiller.discard_when_acknowledged()
        deadline = self._status.close_deadline
        if self._stream is not None:
            self._stream.close(cancel=False, timeout=max(0.0, deadline - time.monotonic()))
            self._stream = None
        if not self._kept_events_uploaded(deadline):
            return False
        self._close_session(deadline)
        return True

    def _kept_events_uploaded(self, deadline: float) -> bool:
        """Whether every event kept until uploaded is in the bucket: asked of the daemon (a durable flush) before
        the close, since closing a session its daemon holds only in part would leave the rest nowhere."""
        with self._cond:
            batches = self._batches
            if not (batches.keep_until_durable and batches.durable < batches.acked):
                return True
            acked = batches.acked
        backoff = self._options.backoff_secs[0]
        while True:
            if self._abandon.is_set() or self._status.spill_all:
                held = -1  # the close gives up before the daemon could say: what it may have lost is spooled
                break
            timeout = max(0.01, min(self._options.rpc_timeout, deadline - time.monotonic()))
            try:
                held = self._transport.flush(self._identity.session_id, timeout)
                break
            except TransportError as exc:
                self.report_error(exc)
                if exc.kind != "away" or time.monotonic() >= deadline:
                    held = -1  # not live there (lost, released or closed): resuming tells what it holds
                    break
                self._abandon.wait(min(backoff, max(0.0, deadline - time.monotonic())))
                backoff = min(backoff * 2, self._options.backoff_secs[1])
        if held >= acked:
            with self._cond:
                batches.acknowledge(held, durable=held)
            return True
        with self._cond:
            self.resume_owed = True
            # Owed again, not delivered: sent again on the resumed session, or spooled when the close gives up.
            batches.doubt_kept(held)
        self._next_attempt = 0.0
        log.warning(
            "summaryd: the daemon at %s holds run %r's session only through sequence %d of %d uploaded at its "
            "close, or could not say: the rest is sent again on the resumed session, or spooled if the close runs "
            "out of time",
            self._transport.address,
            self._identity.run,
            max(held, 0),
            acked,
        )
        return False

    def _close_session(self, deadline: float) -> None:
        backoff = self._options.backoff_secs[0]
        while self._used and not self._abandon.is_set():
            timeout = max(0.01, min(self._options.rpc_timeout, deadline - time.monotonic()))
            try:
                if self._transport.close_session(self._identity.session_id, timeout, self._abandon.wait):
                    with self._cond:
                        self._status.confirm_synced()
                return
            except TransportError as exc:
                self.report_error(exc)
                if exc.kind != "away":
                    return
            if self._abandon.wait(min(backoff, max(0.0, deadline - time.monotonic()))):
                return
            backoff = min(backoff * 2, self._options.backoff_secs[1])

    def flush(self, timeout: float) -> None:
        """Caller's thread: have the daemon fsync the run's file; a failure is noted, never raised."""
        try:
            self._transport.flush(self._identity.session_id, timeout)
        except TransportError as exc:
            self.report_error(exc)

    def cancel(self) -> None:
        """Caller's thread, when `close()` gives up: cut the stream so that the sender thread ends."""
        stream = self._stream
        if stream is not None:
            stream.cancel()

    def shut(self) -> None:
        """When the sender thread ends: release the stream, an opening under way and the transport."""
        self.disconnect()
        if self._opening is not None:
            self._opening.cancel()
        self._transport.close()

    def leave_to_parent(self) -> None:
        self._transport.leave_to_parent()
