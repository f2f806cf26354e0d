"""The client's settings: made once from arguments and the `SUMMARYD_*` environment, then carried.

`ClientOptions.make` is the one place the client reads its environment for them (the daemon's address, the
token and TLS files, the spool root); the sender, the courier, the files uploader and replay are handed the
object, never re-read a variable. Whatever a forked child or a later thread does, it uses the settings its
writer was made with.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from summaryd.client._channel import ChannelSettings
from summaryd.client._environment import resolve_addresses, resolve_redirect_allow
from summaryd.client._spool import default_root

Overflow = Literal["spill", "drop_oldest", "block"]
OVERFLOW_POLICIES: tuple[Overflow, ...] = ("spill", "drop_oldest", "block")


@dataclass(frozen=True)
class ClientOptions:
    """How a client reaches its daemon and what it may hold meanwhile (see `make` for each field's meaning).

    `addresses` are the daemons to try, in turn: the sender moves to the next when one cannot be reached.
    A daemon's redirect is followed only to one of them or of `redirect_allow`.
    """

    addresses: tuple[str, ...]
    channel: ChannelSettings
    spool_root: Path
    spool_enabled: bool = True
    max_queue_bytes: int = 64 * 1024 * 1024
    max_batch_events: int = 1024
    max_batch_bytes: int = 1024 * 1024
    max_in_flight: int = 8
    linger_secs: float = 0.05
    max_linger_secs: float = 2.0
    rpc_timeout: float = 10.0
    close_timeout: float = 5.0
    heartbeat_secs: float = 10.0
    spool_after: float = 10.0
    backoff_secs: tuple[float, float] = (0.05, 2.0)
    overflow: Overflow = "spill"
    block_secs: float | None = None
    redirect_allow: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # As the daemon's `Config`: a bad value is refused where it is given, naming the argument.
        if not self.addresses:
            raise ValueError("address: give at least one daemon address")
        for name in ("max_queue_bytes", "max_batch_events", "max_batch_bytes", "max_in_flight"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be a whole number, at least 1")
        for name in ("rpc_timeout", "heartbeat_secs"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be positive (seconds)")
        for name in ("linger_secs", "max_linger_secs", "close_timeout", "spool_after"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be 0 or more (seconds)")
        if self.block_secs is not None and not self.block_secs >= 0:
            raise ValueError(f"block_secs={self.block_secs!r}: must be 0 or more (seconds), or None (no bound)")
        first, longest = self.backoff_secs
        if not 0 < first <= longest:
            raise ValueError(f"backoff_secs={self.backoff_secs!r}: give (first, longest) with 0 < first <= longest")
        if self.overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow={self.overflow!r}: choose one of {', '.join(OVERFLOW_POLICIES)}")

    @property
    def address(self) -> str:
        """The first daemon of `addresses` (the one tried first)."""
        return self.addresses[0]

    @classmethod
    def make(
        cls,
        *,
        address: str | None = None,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        spool: bool = True,
        redirect_allow: str | Sequence[str] | None = None,
        max_linger_secs: float | None = None,
        environ: Mapping[str, str] = os.environ,
        **tuning: Any,
    ) -> ClientOptions:
        """Arguments win; else `SUMMARYD_ADDRESS`, `SUMMARYD_TOKEN`, `SUMMARYD_TLS*`, `SUMMARYD_SPOOL_DIR`,
        `SUMMARYD_REDIRECT_ALLOW`, `SUMMARYD_MAX_LINGER`.

        The arguments from `max_queue_bytes` on are the fields of the same names (their defaults are the
        fields').

        Args:
            address: `host:port` of the daemon (`host` alone: port 6065), or several separated by commas
                (`a:6065,b:6065`: tried in turn, the next when one cannot be reached); default
                `SUMMARYD_ADDRESS` (the same forms), else `localhost:6065`.
            token, tls_ca, tls_cert, tls_key: bearer token and TLS files; default `SUMMARYD_TOKEN`,
                `SUMMARYD_TLS_CA`/`_CERT`/`_KEY` (`SUMMARYD_TLS=1`: TLS with the system's roots).
            spool_dir: spool root; default `SUMMARYD_SPOOL_DIR`, else `~/.cache/summaryd/spool`.
            spool: whether events may be spooled at all.
            max_queue_bytes: bound of the events held in memory (queued and unacknowledged), in estimated bytes.
            max_batch_events, max_batch_bytes: the largest batch sent at once.
            max_in_flight: batches sent but not yet acknowledged.
            linger_secs: how long a partial batch waits for more events before it is sent.
            max_linger_secs: the longest a daemon's pacing may make a partial batch wait (a busy daemon asks its
                clients for fewer, larger messages); default `SUMMARYD_MAX_LINGER`, else 2 seconds. A flush, a
                close or an end never waits for it.
            rpc_timeout: deadline of each call, and how long a sent batch may wait for its ack.
            close_timeout: default of `close(timeout=...)`, also used at interpreter exit and on SIGTERM.
            heartbeat_secs: longest silence on the stream; the daemon releases sessions it does not hear from.
            spool_after: seconds without any acknowledgement (daemon away or stuck) after which unacknowledged
                events are moved to the spool, where they survive this process.
            backoff_secs: first and longest pause between attempts to reach the daemon.
            overflow: what happens when memory runs over `max_queue_bytes`: `spill` the oldest events to the
                spool (the default; nothing is lost while the local disk takes it), `drop_oldest` queued events,
                or `block` the caller until there is room (at most `block_secs`, then the new event is dropped).
            redirect_allow: daemons beyond `address` that a daemon may send the client to (the owner of a run
                on a bucket logdir), comma-separated or a list; default `SUMMARYD_REDIRECT_ALLOW`, else none. A
                redirect to any other address is not followed (the token and certificate go only where the user
                said).
            environ: the environment to read (the process's own by default).

        Raises:
            ValueError: an address the client cannot dial, half a client certificate, an unknown overflow
                policy, or a bound out of range; the message names the argument and says what to give.
            TypeError: an argument that is not one of these.
        """
        unknown = tuning.keys() - _TUNING
        if unknown:
            raise TypeError(
                f"unexpected argument {sorted(unknown)[0]!r}; the client takes {', '.join(sorted(_TUNING))}"
            )
        if not spool and tuning.get("overflow", "spill") == "spill":
            # Without a spool there is nowhere to spill to: the oldest queued events make room instead.
            tuning["overflow"] = "drop_oldest"
        return cls(
            addresses=resolve_addresses(address, environ),
            channel=ChannelSettings.from_environment(
                token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, environ=environ
            ),
            spool_root=Path(spool_dir) if spool_dir is not None else default_root(environ),
            spool_enabled=spool,
            redirect_allow=resolve_redirect_allow(redirect_allow, environ),
            max_linger_secs=_max_linger(max_linger_secs, environ),
            **tuning,
        )


def _max_linger(value: float | None, environ: Mapping[str, str]) -> float:
    """`max_linger_secs` as given, else `SUMMARYD_MAX_LINGER`, else the field's default."""
    if value is not None:
        return value
    text = environ.get("SUMMARYD_MAX_LINGER", "").strip()
    try:
        return float(text) if text else ClientOptions.max_linger_secs
    except ValueError:
        raise ValueError(f"SUMMARYD_MAX_LINGER={text!r}: give seconds, e.g. 2 or 0.5") from None


# The fields `make` takes as they are: all but those it resolves from its own arguments and the environment.
_TUNING = frozenset(f.name for f in dataclasses.fields(ClientOptions)) - {
    "addresses",
    "channel",
    "spool_root",
    "spool_enabled",
    "redirect_allow",
    "max_linger_secs",
}


def carried_or_made(options: ClientOptions | None, address: str | None, settings: dict[str, Any]) -> ClientOptions:
    """`options` when a caller carries them, else made from `address` and `settings` (`ClientOptions.make`)."""
    if options is None:
        return ClientOptions.make(address=address, **settings)
    if address is not None or settings:
        raise ValueError("give either options or the settings they are made of, not both")
    return options
