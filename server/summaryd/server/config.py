"""The daemon's one typed configuration; the CLI derives its flags and `SUMMARYD_*` variables from it."""

from __future__ import annotations

import dataclasses
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


def fields() -> list[dataclasses.Field[Any]]:
    """The configuration's fields, in declaration order."""
    return list(dataclasses.fields(Config))
