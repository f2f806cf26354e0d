"""Prometheus metrics of the daemon, served over HTTP by `prometheus_client` on `--metrics-listen`."""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

# Writes land in the page cache (sub-millisecond); fsync on close can take much longer on network disks.
_LATENCY_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The daemon's counters, gauges and histograms, in a registry of their own (one per daemon)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.events_received = Counter(
            "summaryd_events_received", "Events received from clients, duplicates included.", ["run"], registry=r
        )
        self.events_written = Counter("summaryd_events_written", "Events written to event files.", ["run"], registry=r)
        self.bytes_written = Counter(
            "summaryd_bytes_written", "Bytes written to event files (framed records).", ["run"], registry=r
        )
        self.batches = Counter("summaryd_batches", "Write batches received.", registry=r)
        self.acks = Counter("summaryd_acks", "Acknowledgements sent to clients.", registry=r)
        self.duplicates = Counter(
            "summaryd_duplicates_dropped", "Events dropped because the daemon already held them.", registry=r
        )
        self.sessions_opened = Counter("summaryd_sessions_opened", "Sessions opened (not resumed).", registry=r)
        self.sessions_closed = Counter("summaryd_sessions_closed", "Sessions closed by their client.", registry=r)
        self.errors = Counter(
            "summaryd_errors", "Requests answered with an error, by gRPC status.", ["code"], registry=r
        )
        self.sessions = Gauge("summaryd_sessions", "Live sessions.", registry=r)
        self.open_files = Gauge("summaryd_open_files", "Event files open for writing.", registry=r)
        self.write_queue = Gauge(
            "summaryd_write_queue_batches", "Batches waiting for or being written by the I/O threads.", registry=r
        )
        self.write_seconds = Histogram(
            "summaryd_write_seconds", "Time to write one batch to its event file.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.fsync_seconds = Histogram(
            "summaryd_fsync_seconds", "Time to fsync an event file.", buckets=_LATENCY_BUCKETS, registry=r
        )

    def serve(self, listen: str) -> Callable[[], None]:
        """Serve `/metrics` on `HOST:PORT` from a thread; return a function that stops it."""
        host, port = listen.rsplit(":", 1)
        server, thread = start_http_server(int(port), addr=host.strip("[]"), registry=self.registry)
        log.info("metrics on http://%s:%d/metrics", host, server.server_port)
        self.port: int = server.server_port

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(5)

        return stop
