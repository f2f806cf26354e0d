"""CRC-32C from its linearity (`crc_columns`) against google-crc32c, the implementation event files are read with."""

from __future__ import annotations

import random

import google_crc32c
import numpy as np

from summaryd.server.records.crc_columns import byte_table, column_crcs, linear_crc, varying_bytes, zero_crc


def test_a_message_crc_is_its_length_constant_and_a_table_entry_per_byte() -> None:
    rng = random.Random(3)
    for length in [*range(1, 40), 255, 256, 1031, 4099]:
        data = rng.randbytes(length)
        crc = zero_crc(length)
        for position, byte in enumerate(data):
            crc ^= int(byte_table(length - 1 - position)[byte])
        assert crc == google_crc32c.value(data), length
        assert linear_crc(data) == crc ^ zero_crc(length)


def test_rows_differing_in_given_columns_get_each_their_own_crc() -> None:
    rng = np.random.default_rng(5)
    for length in (1, 2, 5, 17, 64, 300):
        for count in (1, 2, 3, 50):
            records = np.repeat(rng.integers(0, 256, (1, length), dtype=np.uint8), count, axis=0)
            columns = sorted(rng.choice(length, size=rng.integers(0, length + 1), replace=False).tolist())
            records[:, columns] = rng.integers(0, 256, (count, len(columns)), dtype=np.uint8)
            expected = [google_crc32c.value(row.tobytes()) for row in records]
            assert column_crcs(records, columns).tolist() == expected, (length, count, columns)


def test_varying_bytes_names_the_pieces_that_differ_from_the_first_word() -> None:
    words = np.array([0x1122334455667788, 0x1122334455667788, 0x1122AA4455667700], dtype=np.uint64)
    assert varying_bytes(words, 8) == [0, 5]
    assert varying_bytes(words[:2], 8) == []
    assert varying_bytes(np.array([1, 1 << 8], dtype=np.uint64), 3, bits=7) == [0, 1]
    assert varying_bytes(np.array([5], dtype=np.uint64), 8) == []
