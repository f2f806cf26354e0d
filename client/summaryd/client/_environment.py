"""What the client reads from its environment: the daemon's address and this process's worker label."""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from summaryd.v1.wire import DEFAULT_ADDRESS, DEFAULT_PORT

_ADDRESS_FORMS = (
    f"give HOST:PORT (e.g. localhost:{DEFAULT_PORT}), HOST alone (port {DEFAULT_PORT}), [IPv6]:PORT or unix:/PATH"
)
_GRPC_SCHEMES = frozenset({"dns", "ipv4", "ipv6", "unix", "unix-abstract", "vsock", "xds", "google-c2p"})
"""Target schemes of gRPC's resolvers: `HOST:PORT` with one of these as HOST is read as that scheme's target
(`xds:6065` asks an xDS control plane, `dns:6065` resolves the name `6065`), never as that host."""


def resolve_address(address: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """The first daemon of `resolve_addresses`.

    Raises:
        ValueError: an address is not one the client can dial; the message says what to give.
    """
    return resolve_addresses(address, environ)[0]


def resolve_addresses(address: str | None, environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The argument, else `SUMMARYD_ADDRESS`, else `localhost:6065`: one daemon, or several separated by commas
    (`a:6065,b:6065`, tried in turn); each checked and completed by `parse_address`.

    Raises:
        ValueError: an address is not one the client can dial; the message says what to give.
    """
    if address:
        return parse_addresses(address)
    from_env = environ.get("SUMMARYD_ADDRESS")
    if from_env:
        try:
            return parse_addresses(from_env)
        except ValueError as exc:
            raise ValueError(f"SUMMARYD_ADDRESS: {exc}") from None
    return (DEFAULT_ADDRESS,)


def resolve_redirect_allow(
    allow: str | Sequence[str] | None, environ: Mapping[str, str] = os.environ
) -> tuple[str, ...]:
    """The daemons beyond the configured ones that a redirect may lead to: the argument (a comma-separated
    string, or a sequence of addresses), else `SUMMARYD_REDIRECT_ALLOW`, else none; each in the forms of
    `parse_address`.

    Raises:
        ValueError: an address is not one the client can dial; the message says what to give.
    """
    if allow is None:
        allow = environ.get("SUMMARYD_REDIRECT_ALLOW", "")
        if allow.strip(" ,"):
            try:
                return parse_addresses(allow)
            except ValueError as exc:
                raise ValueError(f"SUMMARYD_REDIRECT_ALLOW: {exc}") from None
    if not isinstance(allow, str):
        allow = ",".join(allow)
    return parse_addresses(allow) if allow.strip(" ,") else ()


def parse_addresses(addresses: str) -> tuple[str, ...]:
    """Each daemon of a comma-separated list (`parse_address`), without repeats, in the order given.

    Raises:
        ValueError: an address is not one the client can dial, or the list is empty.
    """
    parsed = [parse_address(part) for part in addresses.split(",") if part.strip()]
    if not parsed:
        raise ValueError(f"address {addresses!r} names no daemon; {_ADDRESS_FORMS}")
    return tuple(dict.fromkeys(parsed))


def parse_address(address: str) -> str:
    """The gRPC target of a daemon address: `HOST:PORT`, `HOST` alone (port 6065), `[IPv6]:PORT`, a bare IPv6
    address, or `unix:/PATH` (a Unix socket, passed through).

    Raises:
        ValueError: a URL (`http://...`), a port that is not 1..65535, or no host; the message says what to give.
    """
    text = address.strip()
    if text.startswith(("unix:", "unix-abstract:")):
        if text.partition(":")[2].strip("/") == "":
            raise ValueError(f"address {address!r} names no socket path; {_ADDRESS_FORMS}")
        return text
    if "://" in text:
        raise ValueError(f"address {address!r} is a URL; {_ADDRESS_FORMS}")
    if not text or any(c.isspace() or c in "/?#@" for c in text):
        raise ValueError(f"address {address!r} is not a daemon address; {_ADDRESS_FORMS}")
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"address {address!r}: an IPv6 address goes in brackets, e.g. [::1]:{DEFAULT_PORT}")
        port_text = rest[1:] if rest else None
        _check_ipv6(host, address)
    elif text.count(":") > 1:  # a bare IPv6 address, without a port
        host, port_text = text, None
        _check_ipv6(host, address)
    else:
        host, colon, port_text_or_empty = text.partition(":")
        port_text = port_text_or_empty if colon else None
        if not host:
            raise ValueError(f"address {address!r} names no host; {_ADDRESS_FORMS}")
        if host.lower() in _GRPC_SCHEMES:
            raise ValueError(
                f"address {address!r}: gRPC reads {host!r} as a target scheme, not a host; name the host otherwise "
                "(its full name or IP address)"
            )
    port = DEFAULT_PORT
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"address {address!r}: the port must be a number from 1 to 65535")
        port = int(port_text)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_ipv6(host: str, address: str) -> None:
    try:
        ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        raise ValueError(f"address {address!r}: {host!r} is not an IPv6 address; {_ADDRESS_FORMS}") from None


@dataclass(frozen=True)
class Worker:
    """This process's place in a job: the label of its run sub-directory and the world size."""

    label: str
    world_size: int


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def detect_worker(environ: Mapping[str, str] = os.environ) -> Worker:
    """Find the worker label from the launcher's environment.

    torch.distributed (`RANK`/`WORLD_SIZE`), TensorFlow (`TF_CONFIG`), Open MPI (`OMPI_COMM_WORLD_*`) and Slurm
    (`SLURM_PROCID`/`SLURM_NTASKS`) are understood. The label is empty when the world has one process, so a
    single process writes to the run directory itself.
    """
    tf_config = environ.get("TF_CONFIG")
    if tf_config:
        try:
            config = json.loads(tf_config)
            task = config.get("task", {})
            cluster = config.get("cluster", {})
            world = sum(len(v) if isinstance(v, list | dict) else 1 for v in cluster.values())
            if world > 1 and "type" in task:
                return Worker(f"{task['type']}-{int(task.get('index', 0))}", world)
        except (ValueError, TypeError, AttributeError):
            pass
    for rank_var, size_var in (
        ("RANK", "WORLD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ):
        rank, size = _int(environ, rank_var), _int(environ, size_var)
        if rank is not None and size is not None and size > 1:
            return Worker(f"rank-{rank}", size)
    return Worker("", 1)
