"""Prometheus metrics of the daemon, served over HTTP by `prometheus_client` on `--metrics-listen`."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc
from grpc import aio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from summaryd.v1.wire import column_steps

log = logging.getLogger("summaryd.server.metrics")  # the name log lines carry, kept across moves

# Writes land in the page cache (sub-millisecond); fsync on close can take much longer on network disks.
_LATENCY_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LoopCount:
    """A number only the event loop changes: no lock. prometheus_client's counters and gauges take a lock for
    every change (about 1 µs), and a batch counts eight things; the metrics thread reads the number at a scrape,
    and reading it never tears."""

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount


class LoopCounts:
    """A family of `LoopCount`s, by one label's value or none, exposed as a Prometheus counter or gauge."""

    def __init__(self, name: str, documentation: str, label: str = "", kind: str = "counter") -> None:
        self.name, self.documentation, self.label, self.kind = name, documentation, label, kind
        self._counts: dict[str, LoopCount] = {} if label else {"": LoopCount()}

    def labels(self, value: str) -> LoopCount:
        """The count of one label value (made on first use; kept, as prometheus_client keeps a label's child)."""
        count = self._counts.get(value)
        if count is None:
            count = self._counts[value] = LoopCount()
        return count

    def inc(self, amount: float = 1.0) -> None:
        self._counts[""].value += amount

    def dec(self, amount: float = 1.0) -> None:
        self._counts[""].value -= amount

    def family(self) -> Metric:
        labels = [self.label] if self.label else []
        if self.kind == "gauge":
            gauge = GaugeMetricFamily(self.name, self.documentation, labels=labels)
            for value, count in list(self._counts.items()):
                gauge.add_metric([value] if self.label else [], count.value)
            return gauge
        counter = CounterMetricFamily(self.name, self.documentation, labels=labels)
        for value, count in list(self._counts.items()):  # a copy: the loop may add a label meanwhile
            counter.add_metric([value] if self.label else [], count.value, created=count.created)
        return counter


class _LoopCollector(Collector):
    """Hands the registry the `LoopCounts` at a scrape."""

    def __init__(self, families: list[LoopCounts]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return [family.family() for family in self._families]


class Metrics:
    """The daemon's counters, gauges and histograms, in a registry of their own (one per daemon)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # What every batch counts, on the event loop: `LoopCounts`, without a lock per change.
        self.events_received = LoopCounts(
            "summaryd_events_received", "Events received from clients, duplicates included.", "run"
        )
        self.events_written = LoopCounts("summaryd_events_written", "Events written to event files.", "run")
        self.bytes_received = LoopCounts(
            "summaryd_bytes_received", "Bytes of write batches received from clients.", "run"
        )
        self.bytes_written = LoopCounts(
            "summaryd_bytes_written", "Bytes written to event files (framed records).", "run"
        )
        self.batches = LoopCounts("summaryd_batches", "Write batches received.")
        self.acks = LoopCounts("summaryd_acks", "Acknowledgements sent to clients.")
        self.write_queue = LoopCounts(
            "summaryd_write_queue_batches", "Batches waiting for or being written by the I/O threads.", kind="gauge"
        )
        r.register(
            _LoopCollector(
                [
                    self.events_received,
                    self.events_written,
                    self.bytes_received,
                    self.bytes_written,
                    self.batches,
                    self.acks,
                    self.write_queue,
                ]
            )
        )
        self.errors = Counter(
            "summaryd_errors", "Requests answered with an error, by gRPC status.", ["code"], registry=r
        )
        self.write_seconds = Histogram(
            "summaryd_write_seconds", "Time to write one batch to its event file.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.fsync_seconds = Histogram(
            "summaryd_fsync_seconds", "Time to fsync an event file.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.aggregation_tags = Gauge(
            "summaryd_aggregation_tags", "Scalar tags whose state the live run aggregators hold.", registry=r
        )
        self.aggregation_remembered_tags = Gauge(
            "summaryd_aggregation_remembered_tags", "Tags of stopped aggregators whose last step is kept.", registry=r
        )
        self.aggregation_points_refused = Counter(
            "summaryd_aggregation_points_refused",
            "Points not aggregated: their run held --aggregate-max-tags.",
            registry=r,
        )
        self.aggregation_steps_held = Counter(
            "summaryd_aggregation_steps_held",
            "Overdue steps held: beyond the run's second-furthest worker.",
            registry=r,
        )
        self.aggregation_steps_dropped = Counter(
            "summaryd_aggregation_steps_dropped",
            "Pending steps not written: beyond the run's second-furthest worker at the pending bound or the run's end.",
            registry=r,
        )
        self.aggregation_failures = Counter(
            "summaryd_aggregation_failures",
            "Aggregation work that raised (logged; the aggregator goes on).",
            registry=r,
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


class WriteCounts:
    """What one write stream counts, in the servicer's own loop (`SummariesService.Write`): batches, their events
    and bytes received (its run's counters looked up once: `labels` takes a lock and builds a key), acks, and the
    status it ends with. Counted there, not by a layer of its own around the stream: a layer is an async
    generator that every request and every ack passes through, a cost per message."""

    def __init__(self, metrics: Metrics | None) -> None:
        self._metrics = metrics
        self._run: tuple[LoopCount, LoopCount] | None = None

    def received(self, request: Any, run_dir: str, size: int) -> None:
        """A batch received on the stream: `size` is the message's `ByteSize()` (the caller's, computed once)."""
        metrics = self._metrics
        if metrics is None:
            return
        metrics.batches.inc()
        counters = self._run
        if counters is None:  # a stream carries one session, so one run
            counters = self._run = metrics.events_received.labels(run_dir), metrics.bytes_received.labels(run_dir)
        counters[0].inc(len(request.events) + len(column_steps(request.scalars)))
        # The message's size, computed in C: summing the events' sizes would copy each one out.
        counters[1].inc(size)

    def acked(self) -> None:
        if self._metrics is not None:
            self._metrics.acks.inc()

    def failed(self, context: Any) -> None:
        if self._metrics is not None:
            count_error(self._metrics, context)


def count_error(metrics: Metrics, context: Any) -> None:
    """Count a call answered with an error, by its status."""
    code = context.code()
    name = code.name if isinstance(code, grpc.StatusCode) else "CANCELLED" if code is None else str(code)
    metrics.errors.labels(name).inc()


class MetricsInterceptor(aio.ServerInterceptor):  # type: ignore[type-arg]
    """Counts the errors of the unary calls by status; the write and relay streams count themselves (`WriteCounts`)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or not details.method.startswith("/summaryd.v1.Summaries/") or not handler.unary_unary:
            return handler
        metrics = self._metrics
        inner = handler.unary_unary

        async def unary(request: Any, context: Any) -> Any:
            try:
                return await inner(request, context)
            except BaseException:
                count_error(metrics, context)
                raise

        return grpc.unary_unary_rpc_method_handler(
            unary, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )
