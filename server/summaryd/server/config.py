"""The daemon's one typed configuration, composed of the settings of its parts; the CLI derives its flags and
`SUMMARYD_*` variables from it (`options`).

Each setting is declared once, with its default and its help, in the settings dataclass of the part it
configures: `Limits` (security/limits.py), `SealPolicy` (storage/bucket/segments.py), `AggregationSettings`
(aggregation/aggregator.py), and `TlsSettings`, `BucketSettings`, `WatchSettings` and `Config`'s own here.
Each checks its own values when made; `Config` checks what spans parts (the lease against the idle timeout, an
address off loopback against token and TLS).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from summaryd.server import settings
from summaryd.server.aggregation.aggregator import AggregationSettings
from summaryd.server.board.index import SamplesPerPlugin
from summaryd.server.security.auth import TokenTable
from summaryd.server.security.limits import MESSAGE_SLACK_BYTES, Limits
from summaryd.server.settings import Option, option
from summaryd.server.storage.bucket.segments import SealPolicy
from summaryd.server.storage.bucket.store import is_bucket_url, split_url
from summaryd.server.watch import Rules
from summaryd.v1.wire import DEFAULT_PORT

__all__ = ["MESSAGE_SLACK_BYTES", "BucketSettings", "Config", "TlsSettings", "WatchSettings", "options"]

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# HTTP/2's initial window; a smaller one only slows every stream down.
MIN_STREAM_WINDOW_BYTES = 65_535


@dataclass(frozen=True)
class TlsSettings:
    """TLS of the gRPC server: off without a certificate; mutual with a client CA."""

    cert: str = option("", "PEM certificate chain of the server; with --tls-key serves TLS", "FILE", name="tls_cert")
    key: str = option("", "PEM private key of --tls-cert", "FILE", name="tls_key")
    client_ca: str = option(
        "", "PEM CA bundle; when set, clients must present a certificate it signed", "FILE", name="tls_client_ca"
    )

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        if self.client_ca and not self.cert:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)")


@dataclass(frozen=True)
class BucketSettings:
    """What only a bucket logdir uses: staging, when staged events are uploaded, and the daemons of a prefix."""

    staging_dir: str = option(
        "",
        "with a bucket --logdir: where each run's events wait to be uploaded (default STATE_DIR/staging)",
        "DIR",
    )
    seal: SealPolicy = field(default_factory=SealPolicy)
    advertise: str = option(
        "",
        "with a bucket --logdir: the address other daemons send this daemon's clients to (default: the "
        "--listen address with the port bound; this host's name when listening on every address, 0.0.0.0 or [::])",
        "HOST:PORT",
    )
    peers: str = option(
        "",
        "with a bucket --logdir: the --advertise addresses of every daemon of the prefix, comma-separated; a run's "
        "lease naming any other address is taken for a forgery and its clients are sent nowhere (default: any "
        "HOST:PORT a lease names)",
        "A,B",
    )
    run_lease: float = option(
        30.0,
        "with a bucket --logdir: seconds a daemon's claim on a run lasts unless renewed (every third of it); "
        "another daemon takes an expired run over",
        "SECS",
    )

    def __post_init__(self) -> None:
        if self.run_lease <= 0:
            raise ValueError("--run-lease must be positive")
        if self.advertise and not _is_host_port(self.advertise):
            raise ValueError(f"--advertise {self.advertise!r} needs HOST:PORT, e.g. node-3.example:{DEFAULT_PORT}")
        for peer in self.peer_addresses or ():
            if not _is_host_port(peer):
                raise ValueError(f"--peers: {peer!r} needs HOST:PORT, e.g. node-3.example:{DEFAULT_PORT}")

    @property
    def peer_addresses(self) -> tuple[str, ...] | None:
        """The daemons of `--peers` (None without them: any HOST:PORT a lease names is followed)."""
        peers = tuple(p.strip() for p in self.peers.split(",") if p.strip())
        return peers or None


@dataclass(frozen=True)
class WatchSettings:
    """The watch (see README, "The daemon watches the training"): on by default, its rules tuned by a file."""

    enabled: bool = option(
        True,
        "watch the runs for silence, non-finite values, divergence and stragglers; --no-watch turns it off",
        name="watch",
    )
    rules_file: str = option(
        "",
        "TOML (or .yaml/.yml) file tuning the watch's rules, thresholds and runs (see README)",
        "FILE",
        name="watch_rules",
    )
    silent_after: float = option(
        0.0,
        "seconds without a batch after which a worker that logged steadily is silent (0: twice its longest recent "
        "interval between batches, plus 3 s)",
        "SECS",
    )
    webhook: str = option(
        "",
        "POST each finding's firing and resolution to this URL, as Alertmanager's webhook does",
        "URL",
        name="watch_webhook",
    )

    def __post_init__(self) -> None:
        _ = self.rules  # a bad file or value is one line before anything is created
        if self.webhook and not self.webhook.startswith(("http://", "https://")):
            raise ValueError(f"--watch-webhook {self.webhook!r}: give an http:// or https:// URL")

    @functools.cached_property
    def rules(self) -> Rules:
        """The watch's rules (`--watch-rules`, `--silent-after`). Raises ValueError: a bad file or value."""
        return Rules.load(self.rules_file, self.silent_after)


@dataclass(frozen=True)
class Config:
    """Settings of `summaryd serve`. Each option is the flag `--option-name` and the variable
    `SUMMARYD_OPTION_NAME`; `from_options` makes one from options by those names."""

    logdir: str = option(
        "./runs",
        "directory that holds every run's event files (TensorBoard's --logdir), or a bucket: s3://BUCKET/PREFIX "
        "(gs://, az:// too; needs summaryd[s3]), reached through the standard variables (AWS_ENDPOINT_URL, "
        "AWS_ACCESS_KEY_ID, ...)",
        "DIR",
    )
    listen: str = option(f"127.0.0.1:{DEFAULT_PORT}", "address to serve gRPC on; port 0 picks a free port", "HOST:PORT")
    upstream: str = option(
        "",
        "run as a node relay: forward the sessions of the clients here, many in one message, to the daemons at "
        "these addresses (comma-separated, HOST:PORT or unix:PATH), each to the one that holds its run, following "
        "a redirect only to one of them; a relay keeps nothing and writes no --logdir",
        "ADDR[,ADDR...]",
    )
    shutdown_timeout: float = option(
        10.0, "seconds a SIGTERM/SIGINT may take to drain streams and sync files before exiting", "SECS"
    )
    limits: Limits = field(default_factory=Limits)
    stream_window_bytes: int = option(
        256 * 1024,
        "bytes of one write stream the daemon's transport takes in before the client must wait (the HTTP/2 "
        "flow-control window); with one batch per stream, this bounds the daemon's memory per stream",
        "BYTES",
    )
    io_threads: int = option(4, "threads that write and sync event files, off the event loop", "N")
    pace_messages: float = option(
        1000.0,
        "write messages a second the daemon aims to take: past half of it, it asks its clients to linger longer "
        "(fewer, larger batches), at most --pace-max-linger; 0: never",
        "N",
    )
    pace_max_linger: float = option(
        2.0, "the longest the daemon's pacing asks a partial batch to wait (what it adds to visibility)", "SECS"
    )
    log_level: str = option("info", "logging level: debug, info, warning, error", "LEVEL")
    port_file: str = option("", "after binding, write the port to this file (useful with --listen HOST:0)", "FILE")
    state_dir: str = option(
        "", "where the daemon keeps its durable session state (default LOGDIR/.summaryd); one daemon per state", "DIR"
    )
    session_lease: float = option(
        60.0,
        "seconds a session may stay silent (clients send heartbeats) before it is released and its file closed",
        "SECS",
    )
    session_retention_days: float = option(
        30.0, "days the daemon remembers an idle session's sequence numbers (for resume and replay)", "DAYS"
    )
    bucket: BucketSettings = field(default_factory=BucketSettings)
    token_file: str = option(
        "", "file of bearer tokens and the run prefixes each may write; re-read on SIGHUP (see Security)", "FILE"
    )
    tls: TlsSettings = field(default_factory=TlsSettings)
    insecure: bool = option(
        False,
        "allow a non-loopback --listen without token or TLS (anyone may write), and a non-loopback "
        "--metrics-listen (anyone may read run names)",
    )
    metrics_listen: str = option(
        "",
        "serve Prometheus metrics over HTTP on HOST:PORT (off when empty; no token or TLS, keep it on loopback)",
        "HOST:PORT",
    )
    board_listen: str = option(
        "",
        "serve TensorBoard's data provider on HOST:PORT for `tensorboard --grpc_data_provider HOST:PORT` (off when "
        "empty); over TLS with --tls-cert (TensorBoard: --grpc_creds_type ssl); TensorBoard sends no token, so "
        "beyond loopback give --tls-cert or --insecure",
        "HOST:PORT",
    )
    board_runs: str = option("", "serve only the runs under this prefix on --board-listen (all when empty)", "PREFIX")
    samples_per_plugin: str = option(
        "",
        "points kept per series on --board-listen, as TensorBoard's --samples_per_plugin: scalars=1000,images=all,"
        "... (defaults scalars=1000, images=10, audio=10, histograms=500, pr_curves=100, others 10)",
        "PLUGIN=N,...",
    )
    board_readers: int = option(
        0,
        "processes that read the runs already on a local logdir into --board-listen's index when the daemon starts, "
        "when there is over 256 MiB to read (0: one a core, up to 8; 1: a thread of the daemon, whatever the size)",
        "N",
    )
    log_format: str = option("text", "log lines as 'text' or 'json' (one object a line, for log shippers)", "FORMAT")
    aggregation: AggregationSettings = field(default_factory=AggregationSettings)
    watch: WatchSettings = field(default_factory=WatchSettings)

    @classmethod
    def from_options(cls, **values: Any) -> Config:
        """The configuration with the options named as their flags (`max_sessions=8`, `seal_secs=2.0`,
        `tls_cert=...`); every other setting at its default.

        Raises:
            ValueError: a value is out of range, naming its flag.
            TypeError: no option has one of those names.
        """
        return settings.build(cls, values)

    @property
    def upstream_addresses(self) -> tuple[str, ...]:
        """The daemons of `--upstream` (empty: this daemon writes its own logdir, it is no relay)."""
        return tuple(a.strip() for a in self.upstream.split(",") if a.strip())

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
        for address in self.upstream_addresses:
            if not (_is_host_port(address) or (address.startswith("unix:") and len(address) > len("unix:"))):
                raise ValueError(
                    f"--upstream: {address!r} needs HOST:PORT or unix:PATH, e.g. owner-0.example:{DEFAULT_PORT}"
                )
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
        if self.limits.stream_idle_timeout <= self.session_lease / 3:
            raise ValueError(
                f"--stream-idle-timeout {self.limits.stream_idle_timeout:g} must exceed a third of --session-lease "
                f"({self.session_lease / 3:g}s), the longest a client waits between heartbeats"
            )
        if is_bucket_url(self.logdir):
            split_url(self.logdir)  # a ValueError that names the flag
        if self.log_level.lower() not in LOG_LEVELS:
            raise ValueError(f"--log-level {self.log_level!r}: use one of {', '.join(LOG_LEVELS)}")
        if self.log_format not in ("text", "json"):
            raise ValueError(f"--log-format {self.log_format!r}: use 'text' or 'json'")
        if not (self.is_loopback or self.token_file or self.tls.cert or self.insecure):
            raise ValueError(
                f"--listen {self.listen} reaches beyond this machine, but anyone could write to it: give "
                "--token-file and/or --tls-cert/--tls-key, or --insecure to accept that"
            )
        if self.metrics_listen:
            self._check_metrics_listen()
        if self.board_listen:
            self._check_board_listen()
        elif self.board_runs or self.samples_per_plugin or self.board_readers:
            raise ValueError(
                "--board-runs, --samples-per-plugin and --board-readers are settings of --board-listen: give it too"
            )
        if self.board_readers < 0:
            raise ValueError(f"--board-readers {self.board_readers}: give 0 (one a core) or a count of processes")
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
        if not (_is_loopback(_host(value)) or self.tls.cert or self.insecure):
            raise ValueError(
                f"--board-listen {value} reaches beyond this machine, and TensorBoard sends no token: anyone who "
                "reaches it could read every run; serve it on loopback (e.g. 127.0.0.1:6106), over TLS "
                "(--tls-cert, --tls-key), or give --insecure"
            )
        _ = self.samples  # a bad --samples-per-plugin is one line before anything is created

    @property
    def board_reader_count(self) -> int:
        """The processes that read the runs on disk at start (`--board-readers`, 0 resolved to the cores)."""
        if self.board_readers:
            return self.board_readers
        return min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8)

    @functools.cached_property
    def samples(self) -> SamplesPerPlugin:
        """The board index's points per series (`--samples-per-plugin`). Raises ValueError: a bad entry."""
        return SamplesPerPlugin.parse(self.samples_per_plugin)

    def advertised(self, port: int) -> str:
        """The address other daemons send this daemon's clients to, listening on `port`: `--advertise`, else
        the `--listen` host; a wildcard (0.0.0.0, ::) is no address to send anyone to, so this host's name."""
        if self.bucket.advertise:
            return self.bucket.advertise
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
        return self.limits.max_message_bytes + MESSAGE_SLACK_BYTES

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
        return self.bucket.staging_dir or os.path.join(self.state_path, "staging")


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


def options() -> list[Option]:
    """Every option of `summaryd serve`, in the order `--help` lists them."""
    return settings.options(Config)
