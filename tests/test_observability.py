"""Prometheus metrics match what clients sent; logs can be JSON lines; status shows sessions."""

from __future__ import annotations

import json
from pathlib import Path

from _support import metrics_port, scrape, start_daemon, wait_for
from summaryd.client import SummaryWriter


def test_metrics_count_what_clients_sent(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--metrics-listen", "127.0.0.1:0", "--log-format", "json")
    try:
        port = metrics_port(daemon)
        writers = {run: SummaryWriter(run, address=daemon.address, worker="") for run in ("a", "b")}
        for step in range(700):
            writers["a"].add_scalar("x", step, step)
        for step in range(300):
            writers["b"].add_scalar("x", step, step)
        for writer in writers.values():
            assert writer.flush(timeout=30).delivered in (700, 300)
        during = scrape(port)  # both sessions still open
        assert during[("summaryd_events_written_total", (("run", "a"),))] == 700
        assert during[("summaryd_events_written_total", (("run", "b"),))] == 300
        assert during[("summaryd_events_received_total", (("run", "a"),))] == 700
        assert during[("summaryd_bytes_written_total", (("run", "a"),))] > 700 * 16
        assert during[("summaryd_sessions", ())] == 2
        assert during[("summaryd_open_files", ())] == 2
        assert during[("summaryd_acks_total", ())] == during[("summaryd_batches_total", ())] >= 2
        assert during[("summaryd_write_seconds_count", ())] >= 2
        for writer in writers.values():
            assert writer.close().synced
        after = scrape(port)
        assert after[("summaryd_sessions", ())] == 0
        assert after[("summaryd_open_files", ())] == 0
        assert after[("summaryd_fsync_seconds_count", ())] >= 2
        assert after[("summaryd_duplicates_dropped_total", ())] == 0
    finally:
        daemon.terminate()
    # --log-format json: every line is one JSON object; session open and close are logged with counts.
    records = [json.loads(line) for line in daemon.log().splitlines() if line.strip()]
    messages = [r["message"] for r in records]
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    assert any("opened" in m and "run a" in m for m in messages)
    assert any("closed" in m and "run a" in m and "700 events" in m for m in messages)


def test_errors_are_counted_by_status(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--metrics-listen", "127.0.0.1:0")
    try:
        port = metrics_port(daemon)
        writer = SummaryWriter("d/" * 20 + "bad", address=daemon.address, worker="")
        writer.add_scalar("x", 1.0)
        assert writer.close(timeout=10).delivered == 0
        # The client may hear the refusal a moment before the daemon's interceptor has counted it.
        key = ("summaryd_errors_total", (("code", "INVALID_ARGUMENT"),))
        wait_for(lambda: scrape(port).get(key, 0) >= 1, 10, "the refusal to be counted")
    finally:
        daemon.terminate()
