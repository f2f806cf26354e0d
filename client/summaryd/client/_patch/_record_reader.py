"""The records of an event file something else is still writing, read as TensorBoard reads them.

TensorBoard's loader (`event_file_loader.RawEventFileLoader`) reads a file record by record and stops at the
first record it cannot read, a torn one or a corrupt one alike (a length field or data failing its CRC): it
reads nothing after it in that file, and tries the same offset again on its next reload. So does this reader,
but it tells the two apart: a record not whole yet waits (its writer is at it), a corrupt one is named (file,
offset, why) for the shipper to report. It never reads more than one record's bytes past a chunk, and a record
whose length field exceeds the largest event the daemon takes (which would be refused) is stepped over without
being read: a damaged or hostile length field cannot make the shipper allocate it.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from summaryd.v1.wire import FRAMING_BYTES, masked_crc32c

# Bytes read from a file at once, and so the most a checkpoint can lag behind the daemon.
CHUNK_BYTES = 8 * 1024 * 1024
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_HEADER_BYTES = _LENGTH.size + _CRC.size


@dataclass(frozen=True)
class Record:
    """One record of the file: where it starts and ends; `data` None when it was stepped over (too large)."""

    start: int
    end: int
    data: bytes | None


class RecordReader:
    """Reads the records of `path` from an offset; `corrupt` says, once reading stopped, why it stopped at a
    record that can never be read (None: the file ended, or its last record is not whole yet)."""

    def __init__(self, path: Path, max_event_bytes: int) -> None:
        self.path = path
        self.max_event_bytes = max_event_bytes
        self.corrupt: tuple[int, str] | None = None

    def records(self, offset: int) -> Iterator[Record]:
        """Every readable record from `offset` on, in order."""
        self.corrupt = None
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            while offset + _HEADER_BYTES <= size:
                f.seek(offset)
                data = f.read(CHUNK_BYTES)
                position = 0  # in `data`, which starts at `offset`
                while position + _HEADER_BYTES <= len(data):
                    start = offset + position
                    packed = data[position : position + _LENGTH.size]
                    if _CRC.unpack_from(data, position + _LENGTH.size)[0] != masked_crc32c(packed):
                        self.corrupt = (start, "its length field fails its CRC")
                        return
                    (length,) = _LENGTH.unpack(packed)
                    end = start + length + FRAMING_BYTES
                    if end > size:
                        return  # not whole yet
                    if length > self.max_event_bytes:
                        yield Record(start, end, None)
                        position = end - offset
                        break
                    if end - offset > len(data):
                        if position:
                            break  # the next chunk starts with it
                        data += f.read(end - offset - len(data))  # larger than a chunk: read it alone
                        if end - offset > len(data):
                            return  # the file got shorter meanwhile
                    body = data[position + _HEADER_BYTES : position + _HEADER_BYTES + length]
                    if _CRC.unpack_from(data, position + _HEADER_BYTES + length)[0] != masked_crc32c(body):
                        self.corrupt = (start, "its data fails its CRC")
                        return
                    yield Record(start, end, body)
                    position = end - offset
                if position == 0:
                    return  # the file got shorter meanwhile
                offset += position
