"""Runs the daemon: the gRPC server on uvloop, health and reflection, and the ordered shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]  # stubs predate aio
from grpc_reflection.v1alpha import reflection

from summaryd.server.board.backfill import Backfill, runs_on_disk, save_board
from summaryd.server.board.follower import BucketFollower
from summaryd.server.board.index import BoardIndex
from summaryd.server.board.provider import BoardService, add_board_service
from summaryd.server.board.saved import STATE_NAME as SAVED_NAME
from summaryd.server.board.saved import SavedIndex
from summaryd.server.config import Config
from summaryd.server.io_threads import io_executor
from summaryd.server.operations.metrics import Metrics, MetricsInterceptor
from summaryd.server.relay import RelayService, Upstreams
from summaryd.server.security.auth import AuthInterceptor, TokenTable
from summaryd.server.security.refusals import RefusalInterceptor
from summaryd.server.service import SummariesService
from summaryd.server.sessions.lifecycle import SessionCollector, SessionLifecycle
from summaryd.server.sessions.pacing import Pacer
from summaryd.server.sessions.streams import WriteStreams
from summaryd.server.storage.backend import Storage
from summaryd.server.storage.bucket.backend import BucketStorage, DurableWatermarks
from summaryd.server.storage.bucket.leases import RunLeases
from summaryd.server.storage.bucket.run_ownership import LeaseCollector, RunOwnership, holder_id
from summaryd.server.storage.bucket.segments import SegmentShipper
from summaryd.server.storage.bucket.sessions import BucketSessions
from summaryd.server.storage.bucket.store import Bucket, BucketError
from summaryd.server.storage.local import LocalStorage
from summaryd.server.storage.open_files import ensure_open_files
from summaryd.server.storage.runs import RunRegistry
from summaryd.server.storage.state import StateDir
from summaryd.server.watch import STATE_NAME, BoardWriter, FindingBook, Watch, Webhook
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Summaries"].full_name


class StartupError(Exception):
    """The daemon cannot start; the message says what to change (the CLI prints it as one line)."""


class ListenError(StartupError):
    """The gRPC or metrics address could not be bound."""


@dataclass(frozen=True)
class _Serving:
    """What `Server.startup` made, for `main_loop` and `shutdown`."""

    server: aio.Server
    health: health_aio.HealthServicer
    service: SummariesService
    lifecycle: SessionLifecycle
    watch: Watch | None
    # Releases, in reverse order, everything start-up took: the gRPC server, the metrics server, the I/O
    # threads, the state directory (its lock) and the logdir's descriptor.
    resources: contextlib.AsyncExitStack


@dataclass(frozen=True)
class _BucketParts:
    """What a bucket logdir adds to the run writers, made before them (the shipper is their sink)."""

    ownership: RunOwnership
    watermarks: DurableWatermarks
    shipper: SegmentShipper


class Server:
    """The daemon for one `Config`: `await serve()` runs until `request_shutdown()` or a signal.

    `serve()` is `startup()`, `main_loop()`, `shutdown()`: start-up takes every resource into one exit stack,
    so that a failure at any step releases what the steps before it took.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.port: int | None = None
        self.auth: AuthInterceptor | None = None
        self.metrics = Metrics()
        self.metrics_port: int | None = None
        self.board_port: int | None = None
        self._serving: _Serving | None = None
        self._shutting_down = False
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
        """Start up, serve until asked to stop, then shut down in order.

        Raises:
            StartupError: the daemon cannot start; whatever start-up had taken is released, and nothing was
                created on disk when it could not bind.
        """
        if self.config.upstream_addresses:
            await self._relay()
            return
        await self.startup()
        try:
            await self.main_loop()
        finally:
            await self.shutdown()

    async def _relay(self) -> None:
        """Serve as a node relay (`--upstream`): no logdir, no state; every call goes on to the upstream daemons.
        Shutdown: refuse new sessions, end the write streams once their batches are answered, stop."""
        config = self.config
        health = health_aio.HealthServicer()
        server = self._bind(health)
        upstreams = Upstreams(config.upstream_addresses)
        service = RelayService(upstreams)
        pb_grpc.add_SummariesServicer_to_server(service, server)
        if config.port_file:
            try:
                with open(config.port_file, "w") as f:
                    f.write(f"{self.port}\n")
            except OSError as exc:
                await _Listener(server).close()
                raise StartupError(f"cannot write --port-file {config.port_file}: {_reason(exc)}") from None
        for name in ("", SERVICE_NAME):
            await health.set(name, health_pb2.HealthCheckResponse.SERVING)
        await server.start()
        self._started.set()
        log.info("summaryd relaying %s to %s", config.listen, ", ".join(config.upstream_addresses))
        try:
            await self._stop.wait()
        finally:
            await health.enter_graceful_shutdown()
            service.start_draining()
            await server.stop(grace=config.shutdown_timeout / 2)
            await upstreams.close()
            log.info("stopped")

    async def startup(self) -> None:
        """Bind, serve metrics, lock the state directory, open the logdir, recover, then serve.

        Raises:
            StartupError: as `serve`; everything taken until then is released.
        """
        resources = contextlib.AsyncExitStack()
        try:
            self._serving = await self._start(resources)
        except BaseException:
            await resources.aclose()
            raise
        self._started.set()

    async def _start(self, resources: contextlib.AsyncExitStack) -> _Serving:
        config = self.config
        health = health_aio.HealthServicer()
        # Bind first: a port in use (or a TLS file it cannot use) stops start-up before anything is made on disk.
        server = self._bind(health)
        listener = _Listener(server)
        resources.push_async_callback(listener.close)
        board = self._bind_board(resources) if config.board_listen else None
        if config.metrics_listen:
            resources.callback(self._serve_metrics())
        executor = io_executor(config.io_threads)
        resources.callback(executor.shutdown)  # until the state directory is open
        loop = asyncio.get_running_loop()
        # Before anything is served: take the state directory's lock and repair what a killed daemon left.
        state = await loop.run_in_executor(executor, _open_state, config)
        resources.callback(state.close)
        bucket = await self._bucket_parts(executor) if config.is_bucket else None
        shipper = bucket.shipper if bucket is not None else None
        streams = WriteStreams()  # counted by the service, read by the group commit
        try:
            registry = RunRegistry(
                config.local_logdir, executor, state.journal_dir_fd, self.metrics, shipper, streams.commit_now
            )
        except OSError as exc:
            raise StartupError(f"cannot start on --logdir {config.logdir}: {_reason(exc)}") from None
        resources.callback(registry.close)
        # The I/O threads stop (and finish what they do) before the state and the logdir they use close.
        resources.callback(executor.shutdown)
        try:
            report = await loop.run_in_executor(executor, state.recover, registry.logdir_fd)
        except OSError as exc:
            raise StartupError(f"cannot start on --logdir {config.logdir}: {_reason(exc)}") from None
        storage: Storage = LocalStorage(registry)
        if bucket is not None:
            bucket.ownership.start()
            # Released after the shipper's last upload (callbacks run in reverse): the next owner comes after it.
            resources.push_async_callback(bucket.ownership.close)
            await _ship_leftovers(bucket.shipper, config, state.store.last_of_run)
            resources.push_async_callback(bucket.shipper.stop)
            sweeper = asyncio.create_task(
                bucket.watermarks.sessions.sweep_forever(config.session_retention_days * 86400, bucket.ownership.leases)
            )
            resources.push_async_callback(_cancelled, sweeper)
            storage = BucketStorage(registry, bucket.shipper, bucket.ownership, bucket.watermarks)
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
        lifecycle = SessionLifecycle(storage, state.store, config.session_lease, config.limits, config.aggregation)
        # Runs another daemon took over: their sessions here are released as the storage finds them.
        resources.push_async_callback(_cancelled, asyncio.create_task(lifecycle.release_lost()))
        ownership = bucket.ownership if bucket is not None else None
        watch = await self._start_watch(registry, lifecycle, ownership, resources) if config.watch.enabled else None
        board_status = None
        if board is not None:
            store = shipper.bucket if shipper is not None else None
            board_status = await self._serve_board(board, registry, store, resources)
        pacer = Pacer(config.pace_messages, config.pace_max_linger)
        resources.push_async_callback(_cancelled, asyncio.create_task(pacer.keep_time()))
        service = SummariesService(lifecycle, watch, pacer, board_status, self.metrics, streams)
        self.metrics.registry.register(SessionCollector(lifecycle))
        if self.auth is not None:
            log.info("clients need a bearer token (%d in %s)", len(self.auth.tokens), config.token_file)
        if not (config.is_loopback or config.token_file or config.tls.cert):
            log.warning(
                "listening on %s without token or TLS (--insecure): anyone who reaches it can write", config.listen
            )
        # The last step that can fail comes before the servicer is added: a start-up that fails never served a
        # call. Clients that connect from here on wait in the listening socket's backlog until it starts.
        if config.port_file:
            try:
                with open(config.port_file, "w") as f:
                    f.write(f"{self.port}\n")
            except OSError as exc:
                raise StartupError(f"cannot write --port-file {config.port_file}: {_reason(exc)}") from None
        pb_grpc.add_SummariesServicer_to_server(service, server)
        for name in ("", SERVICE_NAME):
            await health.set(name, health_pb2.HealthCheckResponse.SERVING)
        await listener.start()
        where = f"{config.logdir} (staged in {registry.logdir})" if config.is_bucket else registry.logdir
        log.info("summaryd serving %s on %s (port %d)", where, config.host, self.port)
        return _Serving(server, health, service, lifecycle, watch, resources)

    async def _start_watch(
        self,
        registry: RunRegistry,
        lifecycle: SessionLifecycle,
        ownership: RunOwnership | None,
        resources: contextlib.AsyncExitStack,
    ) -> Watch:
        """The watch over every batch written, its findings' book (taken up from the state directory) and
        outputs: metrics, TensorBoard (`<run>/summaryd`), and the webhook when given."""
        config = self.config
        book = await asyncio.to_thread(FindingBook, os.path.join(config.state_path, STATE_NAME))
        board = BoardWriter(registry, ownership.holds if ownership is not None else lambda run: True)
        resources.push_async_callback(board.stop)
        outputs = [board.tell]
        if config.watch.webhook:
            webhook = Webhook(config.watch.webhook, self.metrics.registry)
            resources.callback(webhook.stop)
            outputs.append(webhook.tell)
        watch = Watch(config.watch.rules, lifecycle.sessions.get, book, self.metrics.registry, outputs)
        registry.observe(watch)
        watch.start()
        resources.push_async_callback(watch.stop)
        return watch

    async def _bucket_parts(self, executor: ThreadPoolExecutor) -> _BucketParts:
        """A bucket logdir's run leases, the session state and watermarks in the bucket, and the shipper of the
        staged files, which asks the leases before every upload (recovery's too: leftovers of a run another
        daemon took over since are not uploaded) and tells the watermarks after each.

        Raises:
            StartupError: the bucket library is missing or the bucket's URL unusable.
        """
        config = self.config
        try:
            bucket = Bucket(config.logdir)
        except ImportError:
            raise StartupError(
                f"--logdir {config.logdir} needs the bucket library: pip install 'summaryd[s3]'"
            ) from None
        except Exception as exc:  # obstore's configuration errors (a bad region, a malformed endpoint)
            raise StartupError(f"cannot use --logdir {config.logdir}: {_reason(exc)}") from None
        ownership = await self._run_ownership(bucket, executor)
        watermarks = DurableWatermarks(BucketSessions(bucket), ownership)
        shipper = SegmentShipper(
            bucket,
            config.local_logdir,
            config.bucket.seal,
            executor,
            self.metrics.registry,
            fence=ownership,
            observer=watermarks,
        )
        return _BucketParts(ownership, watermarks, shipper)

    async def _run_ownership(self, bucket: Bucket, executor: ThreadPoolExecutor) -> RunOwnership:
        """The run leases of a bucket logdir, held under this state directory's id (renewed once started)."""
        config = self.config
        try:
            holder = await asyncio.get_running_loop().run_in_executor(executor, holder_id, config.state_path)
        except OSError as exc:
            raise StartupError(f"cannot write the daemon's id in {config.state_path}: {_reason(exc)}") from None
        assert self.port is not None, "the port is bound first"
        address = config.advertised(self.port)
        ownership = RunOwnership(
            RunLeases(bucket, holder, address, config.bucket.run_lease), config.bucket.peer_addresses
        )
        ownership.start()
        self.metrics.registry.register(LeaseCollector(ownership))
        log.info("run leases held as %s, clients of other daemons sent to %s", holder, address)
        return ownership

    async def main_loop(self) -> None:
        """Serve until `request_shutdown()`; meanwhile release sessions whose lease ran out, a few times per lease."""
        assert self._serving is not None, "startup() first"
        lifecycle = self._serving.lifecycle
        interval = min(max(self.config.session_lease / 4, 0.05), 5.0)
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._stop.wait()
            if self._stop.is_set():
                return
            try:
                await lifecycle.expire_idle()
            except Exception:
                log.exception("releasing idle sessions failed")

    async def shutdown(self) -> None:
        """Stop accepting, drain, close every file, then release what start-up took; all under one deadline
        (`--shutdown-timeout`). Safe to call twice."""
        serving = self._serving
        if serving is None or self._shutting_down:
            return
        self._shutting_down = True
        deadline = self.config.shutdown_timeout
        log.info("shutting down (deadline %.1fs)", deadline)
        try:
            # Stop accepting: health says NOT_SERVING, new sessions are refused, idle streams end now.
            await serving.health.enter_graceful_shutdown()
            serving.service.start_draining()
            if serving.watch is not None:  # sessions released from here on are the daemon's doing, not silence
                await serving.watch.stop()
            # Drain: batches, flushes and closes under way finish and are answered (within half the deadline).
            # Then stop at once: waiting for the grace period would only hold up calls that clients keep
            # making to a server that no longer takes them.
            try:
                await asyncio.wait_for(serving.lifecycle.wait_quiet(), timeout=deadline / 2)
            except TimeoutError:
                log.warning("requests still running after %.1fs; cancelling them", deadline / 2)
            await serving.server.stop(grace=0)
            # Flush and sync every file; sessions are released (clients resume them after a restart).
            try:
                await asyncio.wait_for(serving.lifecycle.close_all(), timeout=deadline / 2)
            except TimeoutError:
                log.error("syncing event files did not finish within the shutdown deadline")
        finally:
            # The I/O threads finish, then the logdir and the state directory (its lock) close, then the servers.
            await serving.resources.aclose()
            self._serving = None
        log.info("stopped")

    def _bind(self, health_servicer: health_aio.HealthServicer) -> aio.Server:
        config = self.config
        # Outermost first: the refusal interceptor parses requests for all the others (see `refusals`).
        interceptors: list[Any] = [RefusalInterceptor(), MetricsInterceptor(self.metrics)]
        if config.tokens is not None:  # read and checked with the other settings
            self.auth = AuthInterceptor(config.tokens)
            interceptors.append(self.auth)
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
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server,
        )
        credentials = None
        if config.tls.cert:
            try:
                credentials = _server_credentials(config)
            except OSError as exc:
                raise StartupError(f"cannot read the TLS files: {_reason(exc)}; check --tls-cert/--tls-key") from None
        # gRPC's core writes its own line about a failed bind to stderr; it is caught here and its reason
        # folded into the one line the daemon reports.
        with _stderr_captured() as captured:
            try:
                port = (
                    server.add_secure_port(config.listen, credentials)
                    if credentials is not None
                    else server.add_insecure_port(config.listen)
                )
            except RuntimeError:  # grpc's way of saying the bind failed
                port = 0
        if port == 0:
            reason = _bind_reason(captured[0])
            if credentials is not None and reason is None:
                # The core refuses a certificate or key it cannot use here, in the same call.
                raise StartupError(
                    f"cannot serve TLS: gRPC refused the certificate or key ({_core_message(captured[0])}); "
                    "check --tls-cert and --tls-key (PEM files of a matching pair)"
                )
            raise ListenError(
                f"cannot listen on {config.listen}: {reason or 'the port is in use or the address is not this machine'}"
                "; choose another with --listen (port 0 picks a free one)"
            )
        sys.stderr.write(captured[0])  # the bind succeeded: whatever the core said is not about a failure
        self.port = port
        return server

    def _bind_board(self, resources: contextlib.AsyncExitStack) -> aio.Server:
        """Bind `--board-listen` (served once the index exists, `_serve_board`), beside the gRPC address: a port
        in use stops start-up before anything is made on disk. With `--tls-cert` it serves TLS (no client
        certificate: TensorBoard's `--grpc_creds_type ssl` presents none)."""
        config = self.config
        server = aio.server(options=[("grpc.so_reuseport", 0)])
        try:
            if config.tls.cert:
                port = server.add_secure_port(config.board_listen, _server_credentials(config, clients=False))
            else:
                port = server.add_insecure_port(config.board_listen)
        except OSError as exc:
            raise StartupError(f"cannot read the TLS files: {_reason(exc)}; check --tls-cert/--tls-key") from None
        except RuntimeError:
            port = 0
        if not port:
            raise ListenError(
                f"cannot serve the board on {config.board_listen}: the port is in use or the address is not this "
                "machine; choose another --board-listen"
            )
        resources.push_async_callback(server.stop, 0)
        self.board_port = port
        return server

    async def _serve_board(
        self,
        server: aio.Server,
        registry: RunRegistry,
        bucket: Bucket | None,
        resources: contextlib.AsyncExitStack,
    ) -> Callable[[], pb.BoardStatus]:
        """Serve TensorBoard's data provider on the bound board address, over an index fed by every batch written
        and by what was there before: the runs already on a local logdir (read in the background), or on a
        bucket logdir every segment under the prefix that this daemon does not write (followed). Returns what
        `summaryd status` shows of it."""
        config = self.config
        index = BoardIndex(config.samples, registry.open_file)
        registry.observe(index)
        location = config.logdir if config.is_bucket else registry.logdir
        service = BoardService(index, location, config.board_runs)
        add_board_service(service, server)
        await server.start()
        follower = None
        if bucket is not None:
            follower = BucketFollower(index, bucket, config.board_runs, run_lease=config.bucket.run_lease)
            resources.push_async_callback(_cancelled, asyncio.create_task(follower.follow()))
        else:
            saved = SavedIndex(os.path.join(config.state_path, SAVED_NAME), config.samples)
            on_disk = await asyncio.to_thread(runs_on_disk, registry.logdir)
            backfill = Backfill(index, on_disk, saved, readers=config.board_reader_count)
            # Saved when every batch is written and the reading has stopped (callbacks run in reverse).
            resources.push_async_callback(asyncio.to_thread, save_board, index, saved, registry.logdir)
            backfill.start()
            resources.callback(backfill.stop)
        host = config.board_listen.rsplit(":", 1)[0]
        address = f"{host}:{self.board_port}"
        log.info("TensorBoard reads the daemon: tensorboard --grpc_data_provider %s", address)

        def status() -> pb.BoardStatus:
            return pb.BoardStatus(
                address=address,
                runs=service.run_count(),
                runs_pending=index.pending_runs,
                segments_pending=follower.pending if follower is not None else 0,
            )

        return status

    def _serve_metrics(self) -> Callable[[], None]:
        """Serve `/metrics` on `--metrics-listen`; return what stops it."""
        try:
            stop = self.metrics.serve(self.config.metrics_listen)
        except (OSError, ValueError) as exc:
            raise ListenError(
                f"cannot serve metrics on {self.config.metrics_listen}: {_reason(exc)}; choose another --metrics-listen"
            ) from None
        self.metrics_port = self.metrics.port
        if not self.config.metrics_is_loopback:
            log.warning(
                "metrics on %s reach beyond this machine with neither token nor TLS (--insecure): anyone who "
                "reaches them can read every run's name",
                self.config.metrics_listen,
            )
        return stop


class _Listener:
    """The bound gRPC server; `close()` stops it and frees its port, whether it started or not."""

    def __init__(self, server: aio.Server) -> None:
        self.server = server
        self._started = False

    async def start(self) -> None:
        await self.server.start()
        self._started = True

    async def close(self) -> None:
        # gRPC's core closes the listening socket of a server that was bound but never started only once it
        # has started (stopping it alone keeps the port taken while the process lives): a start-up that failed
        # after the bind starts it to stop it, serving nothing but health and reflection meanwhile.
        if not self._started:
            await self.start()
        await self.server.stop(grace=0)


FULL_COLLECTION_EVERY = 1000
"""Collections of the middle generation between two full collections (CPython's default is 10). A batch's
objects live for a commit tick (40 ms), long enough to be promoted by the young collections, so a busy daemon's
oldest generation grows fast and CPython collected it in full about once a second: with 4,096 live sessions that
was 0.26 s of the event loop each time, and a quarter of the owner's CPU (`benchmarks/job_shape.py`, 4,096 ranks
through relays: 43 full collections, 11.3 s of 45.8 s). The young collections stay as they are: cyclic garbage
that dies young (it can hold a batch's bytes) is still found within some hundreds of allocations; older cycles
wait for the next full collection."""


def tune_collector() -> None:
    """For a process that is the daemon (`run`; never one that embeds it) or acts for many clients as it does
    (the job-shape load generator), called once start-up is done: what start-up made is frozen (never traced
    again), and the oldest generation collected in full every `FULL_COLLECTION_EVERY` collections of the
    middle one."""
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)


def run(config: Config) -> None:
    """Run the daemon in this process until SIGTERM/SIGINT; a second signal exits at once."""
    ensure_open_files(config.limits.max_open_runs)
    server = Server(config)
    tune_collector()
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


def _server_credentials(config: Config, clients: bool = True) -> grpc.ServerCredentials:
    """TLS with the configured certificate; with `--tls-client-ca` (and `clients`), clients must present a
    certificate too."""
    with open(config.tls.key, "rb") as key, open(config.tls.cert, "rb") as cert:
        pair = (key.read(), cert.read())
    client_ca = None
    if config.tls.client_ca and clients:
        with open(config.tls.client_ca, "rb") as ca:
            client_ca = ca.read()
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    if sys.platform == "win32":  # pragma: no cover - uvloop does not run there
        return None
    import uvloop

    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _open_state(config: Config) -> StateDir:
    """The logdir, made when missing, and the locked state directory.

    Raises:
        StartupError: the logdir or state directory is a file, or cannot be made or written.
    """
    logdir = config.local_logdir
    if os.path.exists(logdir) and not os.path.isdir(logdir):
        raise StartupError(f"--logdir {logdir} is a file; give a directory (it is created when missing)")
    if config.state_dir and os.path.exists(config.state_dir) and not os.path.isdir(config.state_dir):
        raise StartupError(f"--state-dir {config.state_dir} is a file; give a directory (it is created when missing)")
    try:
        os.makedirs(logdir, exist_ok=True)
    except OSError as exc:
        raise StartupError(
            f"cannot create --logdir {logdir}: {exc.strerror or exc}; give a directory this user can write"
        ) from None
    if not os.access(logdir, os.W_OK | os.X_OK):
        raise StartupError(f"--logdir {logdir} is not writable by this user; give a directory it can write")
    try:
        return StateDir(config.state_path, config.session_retention_days * 86400)
    except OSError as exc:
        raise StartupError(
            f"cannot open the state directory {config.state_path}: {_reason(exc)}; give a --state-dir "
            "(or --logdir) this user can write"
        ) from None


async def _ship_leftovers(
    shipper: SegmentShipper, config: Config, sessions_of: Callable[[str], dict[str, int]]
) -> None:
    """Upload what a stopped daemon staged, before serving (new segments must sort after it), then start."""
    try:
        await shipper.bucket.check()
        await shipper.recover(sessions_of)
    except BucketError as exc:
        raise StartupError(f"cannot start on --logdir {config.logdir}: {exc}") from None
    shipper.start()


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _reason(exc: BaseException) -> str:
    """An OS error as `reason (path)`, without the errno; other errors as their message."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename})" if exc.filename else exc.strerror
    return str(exc)


def _bind_reason(core_log: str) -> str | None:
    """The OS's reason in gRPC core's bind failure line, e.g. 'Address already in use'."""
    match = re.search(r"':\s*([^()':]+)\)\s*$", core_log.strip())
    return match.group(1).strip() if match else None


def _core_message(core_log: str) -> str:
    """The text of gRPC core's first log line, without its level, time, thread and source file."""
    for line in core_log.splitlines():
        text = line.split("] ", 1)[-1].strip()
        if text:
            return text
    return "no reason given"


@contextlib.contextmanager
def _stderr_captured() -> Iterator[list[str]]:
    """Catch what is written to file descriptor 2 (where gRPC's core logs) while the block runs; the list
    holds it once the block is over."""
    caught: list[str] = []
    sys.stderr.flush()
    with tempfile.TemporaryFile() as file:
        saved = os.dup(2)
        os.dup2(file.fileno(), 2)
        try:
            yield caught
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            file.seek(0)
            caught.append(file.read().decode(errors="replace"))
