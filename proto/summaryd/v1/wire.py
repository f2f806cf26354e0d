"""What the client and the daemon must agree on beyond the messages of `summaryd.proto`.

The version each side reports, the trailing-metadata keys of a refused batch and of a redirect, the default
port, and the TFRecord framing of event files: the daemon writes run files in it and the client spools in it, and both
read it back (recovery, the courier, `summaryd replay`). Both packages import this module; neither defines
any of it again.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import google_crc32c

from summaryd.v1.version import VERSION

__all__ = [
    "DEFAULT_ADDRESS",
    "DEFAULT_PORT",
    "OWNER_ADDRESS_KEY",
    "REFUSED_SEQUENCE_KEY",
    "VERSION",
    "address_key",
    "column_steps",
    "footer",
    "frame",
    "frame_all",
    "header",
    "masked_crc32c",
    "read_records",
    "whole_records",
]

DEFAULT_PORT = 6065
"""The port a daemon listens on and a client dials unless told otherwise (gRPC's own default would be 443)."""

DEFAULT_ADDRESS = f"localhost:{DEFAULT_PORT}"
"""Where a client looks for its daemon when neither an argument nor `SUMMARYD_ADDRESS` says."""

REFUSED_SEQUENCE_KEY = "summaryd-refused-sequence"
"""Trailing metadata of a refused batch: the sequence number of the event refused (see the Write rpc)."""

OWNER_ADDRESS_KEY = "summaryd-owner-address"
"""Trailing metadata of an OpenSession refused because another daemon writes the run: that daemon's advertised
address (HOST:PORT), where the client should open the session instead."""


def address_key(address: str) -> str:
    """What identifies a daemon address (`HOST:PORT`, `[IPv6]:PORT` or `unix:PATH`) when two are compared: the
    host without case, an IP address in its canonical form, the port. Nothing is resolved: `localhost`,
    `127.0.0.1` and a host's name are three addresses; a Unix socket is its path exactly as given. The client
    (its redirects' allow list) and a node relay (its `--upstream` daemons) compare addresses by it alike."""
    address = address.strip()
    if address.startswith(("unix:", "unix-abstract:")):
        return address
    host, _, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") else host
    name, percent, zone = host.partition("%")
    try:
        name = ipaddress.ip_address(name).compressed
    except ValueError:
        name = name.lower()
    host = f"{name}{percent}{zone}"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_HEADER_BYTES = _LENGTH.size + _CRC.size
_FOOTER_BYTES = _CRC.size
FRAMING_BYTES = _HEADER_BYTES + _FOOTER_BYTES
"""Bytes a TFRecord adds around its data: length, length CRC, data CRC."""


def column_steps(columns: Any) -> Sequence[int]:
    """The steps of a `ScalarColumns`: `fixed_step` when the client sent them so (to a daemon that takes them),
    else `step`; never both (`request_checks.column_problem` refuses that)."""
    steps: Sequence[int] = columns.fixed_step or columns.step
    return steps


def masked_crc32c(data: bytes) -> int:
    """CRC-32C of `data`, masked the way TFRecord stores it (so a CRC of CRCs does not look valid)."""
    crc: int = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32


# Format of one record on disk (all little-endian):
#   uint64    length
#   uint32    masked crc32c of length
#   byte      data[length]
#   uint32    masked crc32c of data
def frame(data: bytes) -> bytes:
    """Return `data` framed as one TFRecord."""
    return b"".join((header(len(data)), data, footer(data)))


def frame_all(records: Iterable[bytes]) -> bytes:
    """Frame every record and join them, ready for one write."""
    parts: list[bytes] = []
    for record in records:
        parts += (header(len(record)), record, footer(record))
    return b"".join(parts)


def footer(data: bytes) -> bytes:
    """What follows a record's data: its masked CRC."""
    return _CRC.pack(masked_crc32c(data))


@functools.lru_cache(maxsize=4096)
def header(length: int) -> bytes:
    """Length and its masked CRC. Cached: the events of a run come in few distinct sizes (a scalar's is fixed)."""
    packed = _LENGTH.pack(length)
    return packed + _CRC.pack(masked_crc32c(packed))


def _records(data: bytes) -> Iterator[tuple[bytes, int]]:
    """Each whole record of `data` with the offset where it ends, up to the first torn or corrupt one."""
    offset = 0
    while offset + _HEADER_BYTES <= len(data):
        packed = data[offset : offset + _LENGTH.size]
        if _CRC.unpack_from(data, offset + _LENGTH.size)[0] != masked_crc32c(packed):
            return
        (length,) = _LENGTH.unpack(packed)
        start = offset + _HEADER_BYTES
        end = start + length + _FOOTER_BYTES
        if end > len(data):
            return
        record = data[start : start + length]
        if _CRC.unpack_from(data, start + length)[0] != masked_crc32c(record):
            return
        yield record, end
        offset = end


def whole_records(data: bytes) -> Iterator[bytes]:
    """The records of an event file's bytes, up to the first torn or corrupt one (as TensorBoard reads)."""
    for record, _ in _records(data):
        yield record


def read_records(data: bytes) -> tuple[list[bytes], int]:
    """The whole records at the start of `data` and how many bytes they take (a file still being appended to
    may end in a record that is not whole yet: read again from there later)."""
    records, consumed = [], 0
    for record, consumed in _records(data):  # noqa: B007 - the last end is the answer
        records.append(record)
    return records, consumed
