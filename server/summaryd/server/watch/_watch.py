"""The daemon's watch: a write observer that feeds each run's `RunWatch`, a ticker that evaluates the rules, and
the findings' book, whose changes go to every output (metrics, webhook, TensorBoard, the state file)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge

from summaryd.server.operations.logs import Throttle
from summaryd.server.sessions.live import Session
from summaryd.server.storage.backend import owned_run
from summaryd.server.watch._findings import Finding, FindingBook
from summaryd.server.watch._rules import Rules
from summaryd.server.watch._run_watch import RunWatch, Worker

log = logging.getLogger(__name__)
_failures = Throttle(log)

TICK_SECS = 0.25
Output = Callable[[Finding], None]


class WatchMetrics:
    """The watch's Prometheus series. `summaryd_watch_firing{rule,run}` is present only while a finding of the rule
    fires in the run (its value: how many), so its cardinality is bounded by the findings firing; the others are
    one series each (by rule for the counter)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.firing = Gauge(
            "summaryd_watch_firing",
            "Findings firing, by rule and run (absent: none).",
            ["rule", "run"],
            registry=registry,
        )
        self.fired = Counter("summaryd_watch_fired", "Findings fired, by rule.", ["rule"], registry=registry)
        self.runs = Gauge("summaryd_watch_runs", "Runs the watch follows.", registry=registry)
        self.series = Gauge("summaryd_watch_series", "Series (rank, tag) watched for divergence.", registry=registry)
        self.refused = Counter(
            "summaryd_watch_points_unwatched",
            "Points of series beyond the watch's bound (not watched for divergence).",
            registry=registry,
        )
        self._counts: dict[tuple[str, str], int] = {}

    def tell(self, finding: Finding, restored: bool = False) -> None:
        key = (finding.rule, finding.run)
        count = self._counts.get(key, 0) + (-1 if finding.resolved_unix else 1)
        if finding.resolved_unix:
            if count <= 0:
                self._counts.pop(key, None)
                with contextlib.suppress(KeyError):
                    self.firing.remove(*key)
                return
        elif not restored:
            self.fired.labels(finding.rule).inc()
        self._counts[key] = count
        self.firing.labels(*key).set(count)


class Watch:
    """Watches every run written to (a `runs.WriteObserver`): `written` feeds it, `start` runs its ticker.

    `sessions` finds a live session by id (the session table's `get`); `outputs` are told of every change of a
    finding, on the event loop, and must not block.
    """

    def __init__(
        self,
        rules: Rules,
        sessions: Callable[[str], Session | None],
        book: FindingBook,
        registry: CollectorRegistry | None = None,
        outputs: Sequence[Output] = (),
    ) -> None:
        self.rules = rules
        self.book = book
        self.metrics = WatchMetrics(registry)
        self._sessions = sessions
        self._runs: dict[str, RunWatch] = {}
        self._by_session: dict[str, tuple[Worker, RunWatch]] = {}
        self._series = 0
        self._ticker: asyncio.Task[None] | None = None
        self._saving: asyncio.Task[None] | None = None
        self._save_again = False
        self._started = time.monotonic()
        self._orphans = bool(book.active)  # findings taken up from the state file, until their runs come back
        book.listen(self.metrics.tell, *outputs, self._changed)
        for finding in book.active.values():
            self.metrics.tell(finding, restored=True)

    # ---- the write observer --------------------------------------------------------------------------

    def written(self, run_dir: str, session_id: str, events: Sequence[bytes]) -> None:
        """A batch written by session `session_id` (the daemon's own records, session "", are not watched)."""
        if not session_id:
            return
        known = self._by_session.get(session_id)
        if known is None or known[0].session is None or known[0].session.ending is not None:
            known = self._join(session_id)
            if known is None:
                return
        try:
            known[1].take(known[0], events, time.monotonic())
        except Exception as exc:  # watching never fails a batch
            _failures.warning("watch-batch", "watch: a batch of %s not watched: %r", run_dir, exc)

    def _join(self, session_id: str) -> tuple[Worker, RunWatch] | None:
        session = self._sessions(session_id)
        if session is None or session.ending is not None:
            return None
        run_name = owned_run(session.run.run_dir, session.worker)
        run = self._runs.get(run_name)
        if run is None:
            if len(self._runs) >= self.rules.max_runs:
                _failures.warning("watch-runs", "watch: run %s not watched: %d runs are", run_name, len(self._runs))
                return None
            run = self._runs[run_name] = RunWatch(run_name, self.rules, self._series_room, time.time)
            for finding in self.book.of_run(run_name):
                run.restore(finding)
            self.metrics.runs.set(len(self._runs))
        worker = run.workers.get(session.worker)
        if worker is None:
            worker = run.workers[session.worker] = Worker(session.worker, session)
        worker.session, worker.released_at = session, None
        run.ended = False
        known = self._by_session[session_id] = worker, run
        return known

    def _series_room(self) -> bool:
        if self._series >= self.rules.max_series:
            return False
        self._series += 1
        return True

    # ---- the ticker ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._started = time.monotonic()
        self._ticker = asyncio.create_task(self._tick_forever())

    async def stop(self) -> None:
        """Stop the ticker and write the state file's last version."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        while self._saving is not None and not self._saving.done():
            await self._saving

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECS)
            try:
                self.tick(time.monotonic())
            except Exception:  # one bad evaluation must not stop the watch
                log.exception("watch: evaluating the rules failed")

    def tick(self, now: float) -> None:
        """Evaluate every run's rules; fire what holds and is not firing, resolve what is seen to have ended."""
        book = self.book
        left = False
        for name, run in list(self._runs.items()):
            holds, ended = run.evaluate(now)
            left, run.left = left or run.left, False
            for finding in holds.values():
                book.fire(finding)
            for key, why in ended.items():
                if key in book.active:
                    book.resolve(key, why, run.step)
            if run.series_refused:
                self.metrics.refused.inc(run.series_refused)
                run.series_refused = 0
            if not run.workers:  # every session closed, or lost `lost_secs` ago: the run is over here
                why = "the run's sessions closed" if run.ended else "its workers were lost"
                for finding in list(book.of_run(name)):
                    book.resolve(finding.key, why, run.step)
                self._forget(name, run)
                left = True
        if self._orphans and now - self._started > self.rules.silence.lost_secs:
            # Findings taken up from before a restart whose run never came back.
            self._orphans = False
            for finding in list(book.active.values()):
                if finding.run not in self._runs:
                    book.resolve(finding.key, "no worker of the run came back after the daemon's restart")
        if left:  # sessions whose worker is no longer watched (closed, lost long ago, its run forgotten) go
            self._by_session = {
                s: (w, r)
                for s, (w, r) in self._by_session.items()
                if self._runs.get(r.run) is r and r.workers.get(w.rank) is w
            }
        self.metrics.series.set(self._series)

    def _forget(self, name: str, run: RunWatch) -> None:
        del self._runs[name]
        self._series -= len(run.series)
        self.metrics.runs.set(len(self._runs))

    # ---- what status and `summaryd watch` read -------------------------------------------------------

    def firing(self) -> list[Finding]:
        return sorted(self.book.active.values(), key=lambda f: f.sequence)

    # ---- the state file ------------------------------------------------------------------------------

    def _changed(self, finding: Finding) -> None:
        """Write the state file again after a change, off the event loop, one write at a time."""
        if self._saving is not None and not self._saving.done():
            self._save_again = True
            return
        self._saving = asyncio.ensure_future(self._save())

    async def _save(self) -> None:
        while True:
            self._save_again = False
            try:
                await asyncio.to_thread(self.book.save, self.book.snapshot())
            except OSError as exc:
                _failures.warning("watch-state", "watch: %s not written: %s", self.book.path, exc)
            if not self._save_again:
                return
