"""Runs the daemon: the gRPC server on uvloop, health and reflection, and the ordered shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]  # stubs predate aio
from grpc_reflection.v1alpha import reflection

from summaryd.server.auth import AuthInterceptor, TokenTable
from summaryd.server.config import Config
from summaryd.server.metrics import Metrics, MetricsInterceptor, ServiceCollector
from summaryd.server.open_files import ensure_open_files
from summaryd.server.runs import RunRegistry
from summaryd.server.service import SummariesService
from summaryd.server.state import StateDir
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Summaries"].full_name


class ListenError(OSError):
    """The gRPC address could not be bound."""


class Server:
    """The daemon for one `Config`: `await serve()` runs until `request_shutdown()` or a signal."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.port: int | None = None
        self.auth: AuthInterceptor | None = None
        self.metrics = Metrics()
        self.metrics_port: int | None = None
        self._stop = asyncio.Event()
        self._started = asyncio.Event()

    def reload_tokens(self) -> None:
        """Re-read `--token-file` (SIGHUP); a file that does not parse leaves the old tokens in force."""
        if self.auth is None:
            log.warning("SIGHUP: no --token-file to re-read")
            return
        try:
            tokens = TokenTable.load(self.config.token_file)
        except (OSError, ValueError) as exc:
            log.error("SIGHUP: keeping the old tokens: %s", exc)
            return
        self.auth.reload(tokens)
        log.info("SIGHUP: %d tokens from %s", len(tokens), self.config.token_file)

    def request_shutdown(self) -> None:
        """Ask for the graceful shutdown (what SIGTERM does)."""
        self._stop.set()

    async def wait_started(self) -> int:
        """Wait until the server listens; return its port."""
        await self._started.wait()
        assert self.port is not None
        return self.port

    async def serve(self) -> None:
        config = self.config
        executor = ThreadPoolExecutor(max_workers=config.io_threads, thread_name_prefix="summaryd-io")
        loop = asyncio.get_running_loop()
        # Before anything is served: take the state directory's lock and repair what a killed daemon left.
        state = await loop.run_in_executor(executor, StateDir, config.state_path, config.session_retention_days * 86400)
        try:
            registry = RunRegistry(config.logdir, executor, state.journal_dir_fd, state.store, self.metrics)
            report = await loop.run_in_executor(executor, state.recover, registry.logdir_fd)
            if report.files:
                log.warning(
                    "recovered %d event files left open by a stopped daemon: %d bytes cut, %d files deleted, "
                    "%d sessions' sequence numbers restored",
                    report.files,
                    report.cut_bytes,
                    report.deleted_files,
                    report.sessions,
                )
            if report.damaged:
                log.error(
                    "kept %d damaged state files aside in %s (damaged-*); resuming sessions whose record may be "
                    "lost is refused",
                    report.damaged,
                    state.path,
                )
            service = SummariesService(registry, state.store, config.session_lease, config.limits)
            await self._serve(registry, service, executor)
        finally:
            state.close()

    async def _serve(self, registry: RunRegistry, service: SummariesService, executor: ThreadPoolExecutor) -> None:
        config = self.config
        health_servicer = health_aio.HealthServicer()
        self.metrics.registry.register(ServiceCollector(service))
        interceptors: list[Any] = [MetricsInterceptor(self.metrics, _run_of(service))]
        if config.token_file:
            self.auth = AuthInterceptor(TokenTable.load(config.token_file))
            interceptors.append(self.auth)
            log.info("clients need a bearer token (%d in %s)", len(self.auth.tokens), config.token_file)
        if not (config.is_loopback or config.token_file or config.tls_cert):
            log.warning(
                "listening on %s without token or TLS (--insecure): anyone who reaches it can write", config.listen
            )
        server = aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", config.transport_message_bytes),
                ("grpc.so_reuseport", 0),
                # A fixed window per stream instead of gRPC's bandwidth probing, which grows windows to many MiB
                # per connection: a client flooding without reading acks then piles them up in the daemon's
                # memory (tens of MiB per connection, more when the daemon is short of CPU). On loopback the
                # fixed window costs nothing measurable (benchmarks' ceiling and throughput).
                ("grpc.http2.bdp_probe", 0),
                ("grpc.http2.lookahead_bytes", config.stream_window_bytes),
                # Find connections whose peer vanished (a killed client's host) so that their sessions can expire.
                ("grpc.keepalive_time_ms", int(max(config.session_lease / 2, 1.0) * 1000)),
                ("grpc.keepalive_timeout_ms", 20_000),
            ],
        )
        pb_grpc.add_SummariesServicer_to_server(service, server)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server,
        )
        try:
            if config.tls_cert:
                self.port = server.add_secure_port(config.listen, _server_credentials(config))
            else:
                self.port = server.add_insecure_port(config.listen)
        except RuntimeError:  # grpc's way of saying the bind failed
            self.port = 0
        if self.port == 0:
            raise ListenError(
                f"cannot listen on {config.listen}: the port is in use or the address is not this machine's; "
                "choose another with --listen (port 0 picks a free one)"
            )
        await server.start()
        for name in ("", SERVICE_NAME):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        if config.port_file:
            with open(config.port_file, "w") as f:
                f.write(f"{self.port}\n")
        log.info("summaryd serving %s on %s (port %d)", registry.logdir, config.host, self.port)
        stop_metrics = None
        if config.metrics_listen:
            stop_metrics = self.metrics.serve(config.metrics_listen)
            self.metrics_port = self.metrics.port
        self._started.set()
        leases = asyncio.create_task(self._expire_sessions(service), name="summaryd-leases")
        try:
            await self._stop.wait()
        finally:
            leases.cancel()
            await asyncio.gather(leases, return_exceptions=True)
            await self._shutdown(server, service, registry, health_servicer, executor)
            if stop_metrics is not None:
                stop_metrics()

    async def _expire_sessions(self, service: SummariesService) -> None:
        """Release sessions whose lease ran out, checking a few times per lease."""
        interval = min(max(self.config.session_lease / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(interval)
            try:
                await service.expire_idle_sessions()
            except Exception:
                log.exception("releasing idle sessions failed")

    async def _shutdown(
        self,
        server: aio.Server,
        service: SummariesService,
        registry: RunRegistry,
        health_servicer: health_aio.HealthServicer,
        executor: ThreadPoolExecutor,
    ) -> None:
        deadline = self.config.shutdown_timeout
        log.info("shutting down (deadline %.1fs)", deadline)
        # Stop accepting: health says NOT_SERVING, new sessions are refused, idle streams end now.
        await health_servicer.enter_graceful_shutdown()
        service.start_draining()
        # Drain: batches, flushes and closes under way finish and are answered (within half the deadline).
        # Then stop at once: waiting for the grace period would only hold up calls that clients keep
        # making to a server that no longer takes them.
        try:
            await asyncio.wait_for(service.wait_quiet(), timeout=deadline / 2)
        except TimeoutError:
            log.warning("requests still running after %.1fs; cancelling them", deadline / 2)
        await server.stop(grace=0)
        # Flush and sync every file; sessions are released (clients resume them after a restart).
        try:
            await asyncio.wait_for(self._close_files(service, registry), timeout=deadline / 2)
        except TimeoutError:
            log.error("syncing event files did not finish within the shutdown deadline")
        executor.shutdown(wait=True)
        log.info("stopped")

    async def _close_files(self, service: SummariesService, registry: RunRegistry) -> None:
        await service.release_all()
        await registry.close_all()


def run(config: Config) -> None:
    """Run the daemon in this process until SIGTERM/SIGINT; a second signal exits at once."""
    ensure_open_files(config.max_open_runs)
    server = Server(config)
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            log.warning("second %s: exiting without finishing the shutdown", signal.Signals(signum).name)
            os._exit(1)
        log.info("%s received", signal.Signals(signum).name)
        server.request_shutdown()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        loop.add_signal_handler(signal.SIGHUP, server.reload_tokens)
        await server.serve()

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main())


def _run_of(service: SummariesService) -> Callable[[str], str | None]:
    def run_of(session_id: str) -> str | None:
        session = service.sessions.get(session_id)
        return session.run.run_dir if session is not None else None

    return run_of


def _server_credentials(config: Config) -> grpc.ServerCredentials:
    """TLS with the configured certificate; with `--tls-client-ca`, clients must present a certificate too."""
    with open(config.tls_key, "rb") as key, open(config.tls_cert, "rb") as cert:
        pair = (key.read(), cert.read())
    client_ca = None
    if config.tls_client_ca:
        with open(config.tls_client_ca, "rb") as ca:
            client_ca = ca.read()
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    if sys.platform == "win32":  # pragma: no cover - uvloop does not run there
        return None
    import uvloop

    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
