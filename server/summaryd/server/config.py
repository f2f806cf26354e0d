"""The daemon's one typed configuration; the CLI derives its flags and `SUMMARYD_*` variables from it."""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from summaryd.server.aggregation.aggregator import AggregationSettings
from summaryd.server.board.index import SamplesPerPlugin
from summaryd.server.security.auth import TokenTable
from summaryd.server.security.limits import DEFAULT as _LIMITS
from summaryd.server.security.limits import Limits, flag
from summaryd.server.storage.bucket.segments import SealPolicy
from summaryd.server.storage.bucket.store import is_bucket_url, split_url
from summaryd.v1.wire import DEFAULT_PORT

# How far beyond --max-message-bytes a message still reaches the service (which refuses it naming the flag).
MESSAGE_SLACK_BYTES = 4 * 1024 * 1024
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# HTTP/2's initial window; a smaller one only slows every stream down.
MIN_STREAM_WINDOW_BYTES = 65_535


def _option(default: Any, help: str, metavar: str | None = None) -> Any:
    return field(default=default, metadata={"help": help, "metavar": metavar})


@dataclass(frozen=True)
class Config:
    """Settings of `summaryd serve`. Each field is the flag `--field-name` and the variable `SUMMARYD_FIELD_NAME`."""

    logdir: str = _option(
        "./runs",
        "directory that holds every run's event files (TensorBoard's --logdir), or a bucket: s3://BUCKET/PREFIX "
        "(gs://, az:// too; needs summaryd[s3]), reached through the standard variables (AWS_ENDPOINT_URL, "
        "AWS_ACCESS_KEY_ID, ...)",
        "DIR",
    )
    listen: str = _option(
        f"127.0.0.1:{DEFAULT_PORT}", "address to serve gRPC on; port 0 picks a free port", "HOST:PORT"
    )
    shutdown_timeout: float = _option(
        10.0, "seconds a SIGTERM/SIGINT may take to drain streams and sync files before exiting", "SECS"
    )
    max_message_bytes: int = _option(
        _LIMITS.max_message_bytes,
        f"largest gRPC message (one batch of events) a client may send; gRPC itself drops any message more than "
        f"{MESSAGE_SLACK_BYTES // 2**20} MiB larger",
        "BYTES",
    )
    max_batch_events: int = _option(_LIMITS.max_batch_events, "most events one write batch may carry", "N")
    max_event_bytes: int = _option(_LIMITS.max_event_bytes, "largest serialized event a client may send", "BYTES")
    max_tag_bytes: int = _option(_LIMITS.max_tag_bytes, "longest summary tag (UTF-8 bytes) an event may carry", "BYTES")
    max_run_path_bytes: int = _option(
        _LIMITS.max_run_path_bytes, "longest run path (UTF-8 bytes) a client may name", "BYTES"
    )
    max_run_depth: int = _option(_LIMITS.max_run_depth, "most directories a run path may have", "N")
    max_sessions: int = _option(_LIMITS.max_sessions, "most live sessions, over all clients", "N")
    max_sessions_per_peer: int = _option(
        _LIMITS.max_sessions_per_peer, "most live sessions opened from one client address (host)", "N"
    )
    max_open_runs: int = _option(_LIMITS.max_open_runs, "most runs with an open event file at once", "N")
    stream_idle_timeout: float = _option(
        _LIMITS.stream_idle_timeout,
        "seconds a write stream may send nothing before it is ended (clients send heartbeats at a third of the "
        "lease at most); must exceed a third of --session-lease",
        "SECS",
    )
    stream_window_bytes: int = _option(
        256 * 1024,
        "bytes of one write stream the daemon's transport takes in before the client must wait (the HTTP/2 "
        "flow-control window); with one batch per stream, this bounds the daemon's memory per stream",
        "BYTES",
    )
    io_threads: int = _option(4, "threads that write and sync event files, off the event loop", "N")
    pace_messages: float = _option(
        1000.0,
        "write messages a second the daemon aims to take: past half of it, it asks its clients to linger longer "
        "(fewer, larger batches), at most --pace-max-linger; 0: never",
        "N",
    )
    pace_max_linger: float = _option(
        2.0,
        "the longest the daemon's pacing asks a client's partial batch to wait (what it adds to visibility)",
        "SECS",
    )
    log_level: str = _option("info", "logging level: debug, info, warning, error", "LEVEL")
    port_file: str = _option("", "after binding, write the port to this file (useful with --listen HOST:0)", "FILE")
    state_dir: str = _option(
        "", "where the daemon keeps its durable session state (default LOGDIR/.summaryd); one daemon per state", "DIR"
    )
    session_lease: float = _option(
        60.0,
        "seconds a session may stay silent (clients send heartbeats) before it is released and its file closed",
        "SECS",
    )
    session_retention_days: float = _option(
        30.0, "days the daemon remembers an idle session's sequence numbers (for resume and replay)", "DAYS"
    )

    staging_dir: str = _option(
        "",
        "with a bucket --logdir: where each run's events wait to be uploaded (default STATE_DIR/staging)",
        "DIR",
    )
    seal_secs: float = _option(
        5.0,
        "with a bucket --logdir: seconds new events wait before they are uploaded as a segment (while the run is "
        "young; then longer as it ages, up to --seal-max-secs)",
        "SECS",
    )
    seal_max_secs: float = _option(
        300.0, "with a bucket --logdir: the longest new events of an old run wait before they are uploaded", "SECS"
    )
    seal_bytes: int = _option(
        16 * 1024 * 1024,
        "with a bucket --logdir: a run's segment is uploaded at once when it reaches this size",
        "BYTES",
    )
    advertise: str = _option(
        "",
        "with a bucket --logdir: the address other daemons send this daemon's clients to (default: the "
        "--listen address with the port bound; this host's name when listening on every address, 0.0.0.0 or [::])",
        "HOST:PORT",
    )
    peers: str = _option(
        "",
        "with a bucket --logdir: the --advertise addresses of every daemon of the prefix, comma-separated; a run's "
        "lease naming any other address is taken for a forgery and its clients are sent nowhere (default: any "
        "HOST:PORT a lease names)",
        "A,B",
    )
    run_lease: float = _option(
        30.0,
        "with a bucket --logdir: seconds a daemon's claim on a run lasts unless renewed (every third of it); "
        "another daemon takes an expired run over",
        "SECS",
    )

    token_file: str = _option(
        "", "file of bearer tokens and the run prefixes each may write; re-read on SIGHUP (see Security)", "FILE"
    )
    tls_cert: str = _option("", "PEM certificate chain of the server; with --tls-key serves TLS", "FILE")
    tls_key: str = _option("", "PEM private key of --tls-cert", "FILE")
    tls_client_ca: str = _option("", "PEM CA bundle; when set, clients must present a certificate it signed", "FILE")
    insecure: bool = _option(
        False,
        "allow a non-loopback --listen without token or TLS (anyone may write), and a non-loopback "
        "--metrics-listen (anyone may read run names)",
    )
    metrics_listen: str = _option(
        "",
        "serve Prometheus metrics over HTTP on HOST:PORT (off when empty; no token or TLS, keep it on loopback)",
        "HOST:PORT",
    )
    board_listen: str = _option(
        "",
        "serve TensorBoard's data provider on HOST:PORT for `tensorboard --grpc_data_provider HOST:PORT` (off when "
        "empty; TensorBoard sends no token, so keep it on loopback or give --insecure)",
        "HOST:PORT",
    )
    board_runs: str = _option("", "serve only the runs under this prefix on --board-listen (all when empty)", "PREFIX")
    samples_per_plugin: str = _option(
        "",
        "points kept per series on --board-listen, as TensorBoard's --samples_per_plugin: scalars=1000,images=all,"
        "... (defaults scalars=1000, images=10, audio=10, histograms=500, pr_curves=100, others 10)",
        "PLUGIN=N,...",
    )
    log_format: str = _option("text", "log lines as 'text' or 'json' (one object a line, for log shippers)", "FORMAT")
    aggregate: bool = _option(
        True,
        "reduce each scalar tag of a multi-worker run across its workers into the runs RUN/mean, RUN/min, "
        "RUN/max, RUN/std and RUN/summaryd (counts and straggler lag); --no-aggregate turns it off",
    )
    straggler_secs: float = _option(
        30.0, "seconds a step's aggregate waits for workers that have not reported it before it is written", "SECS"
    )
    aggregate_max_tags: int = _option(
        10_000,
        "scalar tags one run's aggregation holds; the points of further tags are not aggregated (counted and "
        "logged; they still reach their worker's run)",
        "N",
    )

    @property
    def host(self) -> str:
        return _host(self.listen)

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    def __post_init__(self) -> None:
        if ":" not in self.listen:
            raise ValueError(f"--listen {self.listen!r} needs HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}")
        try:
            port = self.port
        except ValueError:
            raise ValueError(f"--listen {self.listen!r}: the port is not a number") from None
        if not 0 <= port <= 65535:
            raise ValueError(f"--listen {self.listen!r}: the port must be 0..65535")
        if self.shutdown_timeout <= 0:
            raise ValueError("--shutdown-timeout must be positive")
        if self.stream_window_bytes < MIN_STREAM_WINDOW_BYTES:
            raise ValueError(f"--stream-window-bytes must be at least {MIN_STREAM_WINDOW_BYTES} (HTTP/2's default)")
        if not self.pace_messages >= 0:
            raise ValueError(f"--pace-messages {self.pace_messages:g}: give messages a second, 0 or more")
        if not self.pace_max_linger > 0:
            raise ValueError(f"--pace-max-linger {self.pace_max_linger:g}: give seconds, more than 0")
        if self.io_threads < 1:
            raise ValueError("--io-threads must be at least 1")
        if self.session_lease <= 0:
            raise ValueError("--session-lease must be positive")
        if self.session_retention_days <= 0:
            raise ValueError("--session-retention-days must be positive")
        for limit in dataclasses.fields(Limits):
            if getattr(self, limit.name) <= 0:
                raise ValueError(f"{flag(limit.name)} must be positive")
        # A --max-event-bytes above --max-message-bytes is allowed and moot: the message limit refuses first.
        if self.stream_idle_timeout <= self.session_lease / 3:
            raise ValueError(
                f"--stream-idle-timeout {self.stream_idle_timeout:g} must exceed a third of --session-lease "
                f"({self.session_lease / 3:g}s), the longest a client waits between heartbeats"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)")
        if is_bucket_url(self.logdir):
            split_url(self.logdir)  # a ValueError that names the flag
        if self.seal_secs <= 0 or self.seal_max_secs <= 0 or self.seal_bytes <= 0:
            raise ValueError("--seal-secs, --seal-max-secs and --seal-bytes must be positive")
        if self.run_lease <= 0:
            raise ValueError("--run-lease must be positive")
        if self.straggler_secs <= 0:
            raise ValueError("--straggler-secs must be positive")
        if self.aggregate_max_tags <= 0:
            raise ValueError("--aggregate-max-tags must be positive")
        if self.advertise and not _is_host_port(self.advertise):
            raise ValueError(f"--advertise {self.advertise!r} needs HOST:PORT, e.g. node-3.example:{DEFAULT_PORT}")
        for peer in self.peer_addresses or ():
            if not _is_host_port(peer):
                raise ValueError(f"--peers: {peer!r} needs HOST:PORT, e.g. node-3.example:{DEFAULT_PORT}")
        if self.log_level.lower() not in LOG_LEVELS:
            raise ValueError(f"--log-level {self.log_level!r}: use one of {', '.join(LOG_LEVELS)}")
        if self.log_format not in ("text", "json"):
            raise ValueError(f"--log-format {self.log_format!r}: use 'text' or 'json'")
        if not (self.is_loopback or self.token_file or self.tls_cert or self.insecure):
            raise ValueError(
                f"--listen {self.listen} reaches beyond this machine, but anyone could write to it: give "
                "--token-file and/or --tls-cert/--tls-key, or --insecure to accept that"
            )
        if self.metrics_listen:
            self._check_metrics_listen()
        if self.board_listen:
            self._check_board_listen()
        elif self.board_runs or self.samples_per_plugin:
            raise ValueError("--board-runs and --samples-per-plugin are settings of --board-listen: give it too")
        _ = self.tokens  # read now, so that a bad file is one line before anything is created

    @functools.cached_property
    def tokens(self) -> TokenTable | None:
        """The tokens of `--token-file`, read once (None without one); SIGHUP re-reads the file itself.

        Raises:
            ValueError: the file cannot be read or does not parse, saying which line.
        """
        if not self.token_file:
            return None
        try:
            return TokenTable.load(self.token_file)
        except OSError as exc:
            raise ValueError(f"--token-file {self.token_file}: {exc.strerror or exc}") from None

    def _check_metrics_listen(self) -> None:
        # The metrics endpoint has neither token nor TLS and names every run: off loopback only when told.
        value = self.metrics_listen
        host, sep, port = value.rpartition(":")
        if not sep or not host:
            raise ValueError(f"--metrics-listen {value!r} needs HOST:PORT, e.g. 127.0.0.1:9090")
        if not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"--metrics-listen {value!r}: the port must be a number 0..65535")
        if not (self.metrics_is_loopback or self.insecure):
            raise ValueError(
                f"--metrics-listen {value} reaches beyond this machine, and metrics name every run with neither "
                "token nor TLS: serve them on loopback (e.g. 127.0.0.1:9090) behind a proxy, or give --insecure "
                "to accept that"
            )

    def _check_board_listen(self) -> None:
        # TensorBoard's data provider client sends no token: whoever reaches the address reads every run it serves.
        value = self.board_listen
        host, sep, port = value.rpartition(":")
        if not (sep and host and port.isdigit() and int(port) <= 65535):
            raise ValueError(f"--board-listen {value!r} needs HOST:PORT, e.g. 127.0.0.1:6106")
        if not (_is_loopback(_host(value)) or self.insecure):
            raise ValueError(
                f"--board-listen {value} reaches beyond this machine, and TensorBoard sends no token: anyone who "
                "reaches it could read every run; serve it on loopback (e.g. 127.0.0.1:6106) or give --insecure"
            )
        _ = self.samples  # a bad --samples-per-plugin is one line before anything is created

    @functools.cached_property
    def samples(self) -> SamplesPerPlugin:
        """The board index's points per series (`--samples-per-plugin`). Raises ValueError: a bad entry."""
        return SamplesPerPlugin.parse(self.samples_per_plugin)

    @property
    def peer_addresses(self) -> tuple[str, ...] | None:
        """The daemons of `--peers` (None without them: any HOST:PORT a lease names is followed)."""
        peers = tuple(p.strip() for p in self.peers.split(",") if p.strip())
        return peers or None

    def advertised(self, port: int) -> str:
        """The address other daemons send this daemon's clients to, listening on `port`: `--advertise`, else
        the `--listen` host; a wildcard (0.0.0.0, ::) is no address to send anyone to, so this host's name."""
        if self.advertise:
            return self.advertise
        host = self.host
        if host in _WILDCARD_HOSTS:
            host = socket.getfqdn() or socket.gethostname()
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def is_loopback(self) -> bool:
        """True when `listen` only accepts connections from this machine."""
        return _is_loopback(self.host)

    @property
    def metrics_is_loopback(self) -> bool:
        """True when `metrics_listen` only accepts connections from this machine (or metrics are off)."""
        return not self.metrics_listen or _is_loopback(_host(self.metrics_listen))

    @property
    def transport_message_bytes(self) -> int:
        """gRPC's own cap on a received message: a little above `max_message_bytes`, so that the service sees a
        message slightly over the limit and refuses it naming `--max-message-bytes`; gRPC cuts off anything
        larger with its own RESOURCE_EXHAUSTED."""
        return self.max_message_bytes + MESSAGE_SLACK_BYTES

    @property
    def limits(self) -> Limits:
        """The limits on what clients control."""
        return Limits(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Limits)})

    @property
    def aggregation(self) -> AggregationSettings:
        """The cross-worker aggregation settings."""
        return AggregationSettings(
            enabled=self.aggregate, straggler_secs=self.straggler_secs, max_tags=self.aggregate_max_tags
        )

    @property
    def state_path(self) -> str:
        """The state directory: `state_dir`, else `.summaryd` inside a local logdir, else (for a bucket) a
        directory per bucket and prefix under `$XDG_STATE_HOME/summaryd` (~/.local/state/summaryd)."""
        if self.state_dir:
            return self.state_dir
        if not self.is_bucket:
            return os.path.join(self.logdir, ".summaryd")
        scheme, bucket, prefix = split_url(self.logdir)
        root = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
        return os.path.join(root, "summaryd", scheme, bucket, *(prefix.split("/") if prefix else []))

    @property
    def is_bucket(self) -> bool:
        """True when the logdir is a bucket URL rather than a local directory."""
        return is_bucket_url(self.logdir)

    @property
    def local_logdir(self) -> str:
        """Where the run writer puts event files: the logdir, or for a bucket the staging directory."""
        if not self.is_bucket:
            return self.logdir
        return self.staging_dir or os.path.join(self.state_path, "staging")

    @property
    def seal_policy(self) -> SealPolicy:
        """When staged events of a bucket logdir are uploaded."""
        return SealPolicy(self.seal_secs, self.seal_bytes, self.seal_max_secs)


def _host(address: str) -> str:
    """The host of `HOST:PORT` (`[::1]:6065` gives `::1`)."""
    return address.rsplit(":", 1)[0].strip("[]")


_WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


def _is_host_port(address: str) -> bool:
    host, sep, port = address.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) <= 65535)


def _is_loopback(host: str) -> bool:
    """True when `host` names only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name that may resolve anywhere


def fields() -> list[dataclasses.Field[Any]]:
    """The configuration's fields, in declaration order."""
    return list(dataclasses.fields(Config))
