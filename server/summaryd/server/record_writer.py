"""TFRecord framing of event-file records, with CRC-32C from `google-crc32c`."""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable

import google_crc32c

_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


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
