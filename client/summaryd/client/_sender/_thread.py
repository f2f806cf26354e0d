"""The sender thread: its loop, and when it wakes up."""

from __future__ import annotations

import threading
import time

from summaryd.client import _process
from summaryd.client._sender._connection import Connection
from summaryd.client._sender._state import log


class SenderThread(Connection):
    """One named daemon thread per sender, started on the first event; it does all the work but queueing."""

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name=f"summaryd-sender[{self.run}]", daemon=True)
        _process.register_multiprocessing_exit()
        try:
            self._thread.start()
        except RuntimeError:  # the interpreter is shutting down
            with self._lock:
                self._failed = "the sender thread could not start (interpreter exiting)"

    def _run(self) -> None:
        try:
            if self._send_loop():
                self._finish()
        except Exception as exc:  # a bug here must not go unnoticed, nor reach the training loop
            log.exception("summaryd sender for run %r failed", self.run)
            with self._cond:
                self._failed = f"sender failed: {exc!r}"
        finally:
            self._disconnect()
            if self._opening is not None:
                self._opening.cancel()
            if self._channel is not None:
                self._channel.close()
                self._channel = None
            self._put_spool_away()
            with self._cond:
                self._cond.notify_all()

    def _send_loop(self) -> bool:
        """Run until everything is acknowledged after a close (True), or until told to stop (False)."""
        while True:
            with self._cond:
                if self._failed is not None:
                    return False
                if self._closing and not self._queue and not self._log:
                    return True
                if self._outbox_pid is not None and self._closing and not self._queue and not self._held_events:
                    return False  # all in the outbox: the parent's courier delivers it
            if self._abandon.is_set():
                self._spill(everything=True)
                return False
            self._handle_refusal()
            self._discard_spool_when_acknowledged()
            self._poll_connection()
            self._take_batches()
            # Closing while the daemon is away: make everything safe on disk now, then keep trying to deliver
            # until close() runs out of time.
            self._spill(everything=self._spill_all or self._closing_while_unreachable())
            self._send_ready()
            self._keep_stream_alive()
            self._wake.wait(self._next_wakeup())
            self._wake.clear()

    def _take_batches(self) -> None:
        """Number queued events into batches: as many as may be in flight, and all of them when spilling."""
        while True:
            with self._cond:
                if not self._queue:
                    return
                spilling = self._must_spill()
                if not spilling:
                    if self._stream is None or self._in_flight >= self.max_in_flight:
                        return
                    lingering = time.monotonic() - self._queued_at < self.linger_secs
                    small = len(self._queue) < self.max_batch_events and self._queued_bytes < self.max_batch_bytes
                    if lingering and small and not self._closing:
                        return
            batch = self._take_batch()
            if batch is None:
                return
            if spilling:
                self._spill_batch(batch)

    def _next_wakeup(self) -> float:
        now = time.monotonic()
        waits = [self._heartbeat_interval() - (now - self._last_sent), 1.0]
        with self._lock:
            if self._queue:
                waits.append(self.linger_secs - (now - self._queued_at))
            if self._queue or self._log:
                waits.append(self.spool_after - (now - self._progress_at))
                waits.append(0.1)  # acks, overdue batches and the in-flight window
        if self._stream is None and self._opening is None:
            waits.append(self._next_attempt - now)
        return max(0.001, min(waits))
