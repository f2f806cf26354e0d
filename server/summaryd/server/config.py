"""The daemon's one typed configuration; the CLI derives its flags and `SUMMARYD_*` variables from it."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any


def _option(default: Any, help: str, metavar: str | None = None) -> Any:
    return field(default=default, metadata={"help": help, "metavar": metavar})


@dataclass(frozen=True)
class Config:
    """Settings of `summaryd serve`. Each field is the flag `--field-name` and the variable `SUMMARYD_FIELD_NAME`."""

    logdir: str = _option("./runs", "directory that holds every run's event files (TensorBoard's --logdir)", "DIR")
    listen: str = _option("127.0.0.1:6065", "address to serve gRPC on; port 0 picks a free port", "HOST:PORT")
    shutdown_timeout: float = _option(
        10.0, "seconds a SIGTERM/SIGINT may take to drain streams and sync files before exiting", "SECS"
    )
    max_message_bytes: int = _option(
        64 * 1024 * 1024, "largest gRPC message (one batch of events) a client may send", "BYTES"
    )
    io_threads: int = _option(4, "threads that write and sync event files, off the event loop", "N")
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

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    def __post_init__(self) -> None:
        if ":" not in self.listen:
            raise ValueError(f"--listen {self.listen!r} needs HOST:PORT, e.g. 127.0.0.1:6065")
        try:
            port = self.port
        except ValueError:
            raise ValueError(f"--listen {self.listen!r}: the port is not a number") from None
        if not 0 <= port <= 65535:
            raise ValueError(f"--listen {self.listen!r}: the port must be 0..65535")
        if self.shutdown_timeout <= 0:
            raise ValueError("--shutdown-timeout must be positive")
        if self.io_threads < 1:
            raise ValueError("--io-threads must be at least 1")
        if self.session_lease <= 0:
            raise ValueError("--session-lease must be positive")
        if self.session_retention_days <= 0:
            raise ValueError("--session-retention-days must be positive")

    @property
    def state_path(self) -> str:
        """The state directory: `state_dir`, else `.summaryd` inside the logdir."""
        return self.state_dir or os.path.join(self.logdir, ".summaryd")


def fields() -> list[dataclasses.Field[Any]]:
    """The configuration's fields, in declaration order."""
    return list(dataclasses.fields(Config))
