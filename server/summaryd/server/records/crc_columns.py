"""CRC-32C of many records of one length at once, from the CRC's linearity.

CRC-32C as google-crc32c computes it (and TFRecord uses it: initial value and final xor both 0xFFFFFFFF) is
affine over GF(2) for messages of one length L: `crc(x) = crc(0^L) ^ lin(x)`, where `lin` is linear, so a
message's bytes contribute independently: byte `b` followed by `d` more bytes contributes `byte_table(d)[b]`,
whatever precedes it. Records of one layout that differ in a few byte columns (a scalar's step, wall time and
value) therefore have CRCs `crc(first) ^ XOR over the differing columns j of (T_j[x_j] ^ T_j[first_j])`: one
google-crc32c call per group and one table gather per column that varies, instead of one call per record.
The tables come from google-crc32c itself (a byte's contribution is a CRC of that byte and zeros, less the
zeros' own), so they cannot disagree with it.
"""

from __future__ import annotations

import functools

import google_crc32c
import numpy as np
from numpy.typing import NDArray

_BITS = (np.arange(256)[:, None] >> np.arange(8)) & 1  # bit i of each byte value


@functools.lru_cache(maxsize=4096)
def zero_crc(length: int) -> int:
    """The CRC-32C of `length` zero bytes: the affine part of the CRC of any message of that length."""
    crc: int = google_crc32c.value(bytes(length))
    return crc


def linear_crc(data: bytes) -> int:
    """The linear part of `data`'s CRC-32C: its CRC less that of as many zero bytes (XOR is additive here)."""
    crc: int = google_crc32c.value(data)
    return crc ^ zero_crc(len(data))


@functools.lru_cache(maxsize=4096)
def byte_table(distance: int) -> NDArray[np.uint32]:
    """What each byte value contributes to a CRC-32C when `distance` bytes follow it in the message.

    Linear in the byte, so eight CRCs (one per bit) give the whole table."""
    bits = np.array([linear_crc(bytes([1 << bit]) + bytes(distance)) for bit in range(8)], dtype=np.uint32)
    table: NDArray[np.uint32] = np.bitwise_xor.reduce(np.where(_BITS == 1, bits, np.uint32(0)), axis=1)
    table.flags.writeable = False
    return table


def varying_bytes(words: NDArray[np.unsignedinteger], width: int, bits: int = 8) -> list[int]:
    """Which of the `width` little-endian `bits`-bit pieces of `words` differ from the first word's somewhere."""
    if len(words) < 2:
        return []
    differ = int(np.bitwise_or.reduce(words ^ words[0]))
    mask = (1 << bits) - 1
    return [piece for piece in range(width) if (differ >> (bits * piece)) & mask]


def column_crcs(records: NDArray[np.uint8], columns: list[int]) -> NDArray[np.uint32]:
    """The CRC-32C of each row of `records` (records of one length), given every column in which rows may differ.

    Columns not listed must hold the same byte in every row (the caller knows its layout)."""
    length = records.shape[1]
    first = records[0]
    crcs = np.zeros(len(records), dtype=np.uint32)
    constant: int = google_crc32c.value(first.tobytes())
    for column in columns:
        table = byte_table(length - 1 - column)
        crcs ^= table.take(records[:, column])
        constant ^= int(table[first[column]])  # the first row's own byte, already in its CRC
    crcs ^= np.uint32(constant)
    return crcs
