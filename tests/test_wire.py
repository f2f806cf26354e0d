"""The shared wire module: TFRecord framing read back by TensorBoard's own reader, torn and corrupt records, and
the one atomic file replacement both sides use (a reader or a crash sees the old file or the new, never half)."""

from __future__ import annotations

import importlib.metadata
import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.summary.writer.record_writer import RecordWriter

from summaryd.v1 import wire
from summaryd.v1.atomic import replace_file
from summaryd.v1.wire import frame, frame_all, read_records, whole_records

ROOT = Path(__file__).resolve().parent.parent
# Sizes around the framing's edges: empty, one byte, and records longer than the 12-byte header.
RECORDS = [b"", b"x", bytes(range(256)) * 3, Event(step=7, file_version="brain.Event:2").SerializeToString()]


def _tensorboard_reads(path: Path) -> list[bytes]:
    return list(RawEventFileLoader(str(path), detect_file_replacement=False).Load())


def test_framed_records_read_back_by_tensorboard(tmp_path: Path) -> None:
    """What `frame_all` writes, TensorBoard's loader reads back record for record (every CRC checked)."""
    path = tmp_path / "events.out.tfevents.1.host"
    path.write_bytes(frame_all(RECORDS))
    assert _tensorboard_reads(path) == RECORDS


def test_framing_is_byte_for_byte_tensorboards() -> None:
    """`frame` and `frame_all` produce exactly what TensorBoard's own `RecordWriter` writes."""
    written = io.BytesIO()
    writer = RecordWriter(written)
    for record in RECORDS:
        writer.write(record)
    assert written.getvalue() == frame_all(RECORDS) == b"".join(frame(r) for r in RECORDS)


def test_reading_what_tensorboard_wrote() -> None:
    written = io.BytesIO()
    writer = RecordWriter(written)
    for record in RECORDS:
        writer.write(record)
    data = written.getvalue()
    assert read_records(data) == (RECORDS, len(data))
    assert list(whole_records(data)) == RECORDS


def test_a_torn_tail_is_left_for_later(tmp_path: Path) -> None:
    """Cut anywhere, the bytes give the whole records before the cut and where they end, as TensorBoard reads
    them: a file still being appended to is read again from that offset once the record is whole."""
    data = frame_all(RECORDS)
    ends = [len(frame_all(RECORDS[:n])) for n in range(len(RECORDS) + 1)]
    path = tmp_path / "events.out.tfevents.1.host"
    for cut in range(len(data) + 1):
        whole = max(n for n, end in enumerate(ends) if end <= cut)
        assert read_records(data[:cut]) == (RECORDS[:whole], ends[whole]), cut
        path.write_bytes(data[:cut])
        assert _tensorboard_reads(path) == RECORDS[:whole], cut
    # Reading on from where the whole records ended gives the rest, once it is there.
    _, consumed = read_records(data[: ends[2] + 5])
    assert read_records(data[consumed:]) == (RECORDS[2:], len(data) - consumed)


@pytest.mark.parametrize(
    ("where", "what"),
    [(0, "the length"), (9, "the length's CRC"), (12, "the data"), (-1, "the data's CRC")],
)
def test_a_corrupt_record_ends_the_reading(tmp_path: Path, where: int, what: str) -> None:
    """A flipped bit in any part of a record (`what`) stops reading before it, as TensorBoard's reader does;
    the records before it are read."""
    first, second, third = frame(b"first"), bytearray(frame(b"second record")), frame(b"third")
    second[where] ^= 0x01
    data = first + bytes(second) + third
    assert read_records(data) == ([b"first"], len(first)), what
    assert list(whole_records(data)) == [b"first"], what
    path = tmp_path / "events.out.tfevents.1.host"
    path.write_bytes(data)
    assert _tensorboard_reads(path) == [b"first"], what


def test_the_version_is_the_installed_packages() -> None:
    assert importlib.metadata.version("summaryd") == wire.VERSION


def test_each_shared_literal_is_written_once() -> None:
    """The refused-sequence key is the one the proto documents, and neither side spells it out again."""
    assert wire.REFUSED_SEQUENCE_KEY in (ROOT / "proto" / "summaryd" / "v1" / "summaryd.proto").read_text()
    spelled = [
        path.relative_to(ROOT).as_posix()
        for side in ("client", "server", "proto")
        for path in (ROOT / side).rglob("*.py")
        if not path.name.endswith(("_pb2.py", "_pb2_grpc.py")) and wire.REFUSED_SEQUENCE_KEY in path.read_text()
    ]
    assert spelled == ["proto/summaryd/v1/wire.py"]


def test_replace_file_replaces_whole(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    replace_file(path, b"old")
    replace_file(path, b"new content")
    assert path.read_bytes() == b"new content"
    assert os.listdir(tmp_path) == ["manifest.json"]  # no temporary file left behind


def test_replace_file_relative_to_a_directory_descriptor(tmp_path: Path) -> None:
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        replace_file("store", b"one", dir_fd=dir_fd, temporary="store.tmp")
        replace_file("store", b"two", dir_fd=dir_fd, temporary="store.tmp")
        (tmp_path / "store.tmp").write_bytes(b"left by a crash")
        # The temporary name is created exclusively: one left by a crash is refused, not written through.
        with pytest.raises(FileExistsError):
            replace_file("store", b"three", dir_fd=dir_fd, temporary="store.tmp")
    finally:
        os.close(dir_fd)
    assert (tmp_path / "store").read_bytes() == b"two"


def test_a_failure_before_the_rename_leaves_the_old_file(tmp_path: Path) -> None:
    """Whatever fails before the rename (here: the hook that runs just before it) leaves the old file whole and
    removes the temporary one."""
    path = tmp_path / "state"
    path.write_bytes(b"old")
    seen: list[bytes] = []

    def fail(temporary: str) -> None:
        seen.append(Path(temporary).read_bytes())
        raise OSError("refused")

    with pytest.raises(OSError, match="refused"):
        replace_file(path, b"new", before_replace=fail)
    assert seen == [b"new"]  # the new content was whole and synced before the rename was due
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["state"]


def test_a_crash_before_the_rename_leaves_the_old_file(tmp_path: Path) -> None:
    """A process that dies between writing and renaming leaves the old file whole: the new content sits only in
    the temporary file."""
    path = tmp_path / "state"
    path.write_bytes(b"old")
    dies_before_rename = (
        "import os, sys\n"
        "from summaryd.v1.atomic import replace_file\n"
        "replace_file(sys.argv[1], b'new', before_replace=lambda _: os._exit(3))\n"
    )
    done = subprocess.run([sys.executable, "-c", dies_before_rename, str(path)], check=False, timeout=60)
    assert done.returncode == 3
    assert path.read_bytes() == b"old"
    [temporary] = [p for p in tmp_path.iterdir() if p != path]
    assert temporary.read_bytes() == b"new"


def test_a_reader_sees_the_old_file_or_the_new_never_half(tmp_path: Path) -> None:
    """A reader that reads while the file is replaced over and over only ever sees one whole version."""
    path = tmp_path / "manifest.json"
    versions = [bytes([n]) * 1_000_000 for n in range(20)]
    replace_file(path, versions[0])
    done = threading.Event()
    reads: list[int] = []
    torn: list[int] = []

    def read() -> None:
        while not done.is_set():
            content = path.read_bytes()
            reads.append(len(content))
            if content not in versions:
                torn.append(len(content))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for version in versions[1:]:
            replace_file(path, version)
    finally:
        done.set()
        reader.join()
    assert path.read_bytes() == versions[-1]
    assert reads
    assert torn == []
