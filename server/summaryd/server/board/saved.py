"""The board index kept across restarts: its samples, saved in the state directory when the daemon stops.

A daemon restarted on a logdir it indexed before takes the samples up from `board-index` and reads only what
its event files gained since (`Backfill`), instead of every event again. The file is TFRecord-framed records
(each one's CRC checked on load): a header (the version and the sampling it was made with), then per run a
record saying what it holds and its series' points (scalars as three columns; tensors and blobs as their
bytes), then an end record. Each run names its event files and how far into each its points go, with the 4
bytes that end there (a record's CRC); a run is taken up only when its files are still those, in that order,
at least that long, with those bytes there. Anything else is read again from its files: a file that is damaged
(a record's CRC, an unknown version) is kept aside as `damaged-*`, as the other state files are, and the
daemon reads the logdir as if it had none.

What is not kept: the state of a series' random draws. A series taken up draws on from a fresh seed, so its
sample stays uniform but is not the very one TensorBoard would keep reading the files from the start.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tensorboard.compat.proto.summary_pb2 import DATA_CLASS_BLOB_SEQUENCE, DATA_CLASS_SCALAR, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto

from summaryd.server.board.index import Datum, Reservoir, RunIndex, SamplesPerPlugin, ScalarPoints, Series
from summaryd.server.board.marks import FileMark
from summaryd.server.storage.state_file import replace_state_file
from summaryd.v1.wire import frame, frame_all, whole_records

log = logging.getLogger(__name__)

STATE_NAME = "board-index"
_VERSION = 1


@dataclass
class Restored:
    """A run taken up: its index, and by file name where to read its files on from."""

    run: RunIndex
    offsets: dict[str, int]


class SavedIndex:
    """The state file `path` of an index sampled as `samples`."""

    def __init__(self, path: str, samples: SamplesPerPlugin) -> None:
        self.path = path
        self._samples = samples

    def _header(self) -> bytes:
        return json.dumps({"version": _VERSION, "samples": self._samples.describe()}, sort_keys=True).encode()

    def save(self, runs: Iterator[tuple[str, RunIndex, list[FileMark]]]) -> int:
        """Write the runs given, each with its files' marks: a temporary file, fsynced, renamed over the state
        file (blocking). Returns the runs written."""
        count = 0

        def chunks() -> Iterator[bytes]:
            nonlocal count
            yield frame(self._header())
            for name, run, marks in runs:
                yield frame_all(_run_records(name, run, marks))
                count += 1
            yield frame(json.dumps({"end": count}).encode())

        replace_state_file(self.path, chunks())
        return count

    def load(self, on_disk: dict[str, list[str]]) -> dict[str, Restored]:
        """The runs of the state file whose files `on_disk` (by run, paths in name order) still hold; {} when
        there is none, it was made with other sampling, or it is damaged (kept aside)."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        records = iter(list(whole_records(data)))
        try:
            header = json.loads(next(records))
            if header.get("version") != _VERSION:
                raise ValueError(f"version {header.get('version')!r}")
            if header.get("samples") != self._samples.describe():
                log.info("board: %s was saved with other --samples-per-plugin; every run is read again", self.path)
                return {}
            restored: dict[str, Restored] = {}
            skipped = 0
            while True:
                head = json.loads(next(records))
                if "end" in head:
                    if head["end"] != len(restored) + skipped:
                        raise ValueError("fewer runs than its end says")
                    break
                name, run, marks = _read_run(head, records, self._samples)
                paths = on_disk.get(name, [])
                if len(paths) >= len(marks) and all(m.holds(p) for m, p in zip(marks, paths, strict=False)):
                    restored[name] = Restored(run, {m.name: m.offset for m in marks})
                else:
                    skipped += 1
        except (StopIteration, ValueError, KeyError, TypeError, IndexError) as exc:
            self._set_aside(exc)
            return {}
        if skipped:
            log.info("board: %d saved runs' files changed since they were saved; those are read again", skipped)
        return restored

    def _set_aside(self, exc: BaseException) -> None:
        aside = os.path.join(os.path.dirname(self.path), f"damaged-{int(time.time())}-{STATE_NAME}")
        with contextlib.suppress(OSError):
            os.replace(self.path, aside)
        log.error(
            "board: %s is damaged (%r), kept aside as %s; every run is read from its files", self.path, exc, aside
        )


def _run_records(name: str, run: RunIndex, marks: list[FileMark]) -> Iterator[bytes]:
    series = [
        {
            "tag": tag,
            "class": s.data_class,
            "capacity": s.reservoir.capacity,
            "seen": s.reservoir.seen,
            "metadata": _b64(s.metadata.SerializeToString()),
            "points": len(s.reservoir.items),
        }
        for tag, s in run.series.items()
    ]
    head = {
        "run": name,
        "start": run.start_time,
        "session_started": run.session_started,
        "initial": {tag: _b64(m.SerializeToString()) for tag, m in run.initial.items()},
        "files": [[m.name, m.offset, _b64(m.tail)] for m in marks],
        "series": series,
    }
    yield json.dumps(head).encode()
    for s in run.series.values():
        items = s.reservoir.items
        if isinstance(items, ScalarPoints):
            yield from items.column_bytes()
            continue
        yield array("q", [d.step for d in items]).tobytes()
        yield array("d", [d.wall_time for d in items]).tobytes()
        for d in items:
            yield frame_all(d.value) if isinstance(d.value, tuple) else d.value.SerializeToString()  # type: ignore[union-attr]


def _read_run(
    head: dict[str, Any], records: Iterator[bytes], samples: SamplesPerPlugin
) -> tuple[str, RunIndex, list[FileMark]]:
    run = RunIndex(samples, start_time=head["start"])
    run.session_started = bool(head["session_started"])
    run.initial = {tag: SummaryMetadata.FromString(_unb64(m)) for tag, m in head["initial"].items()}
    for entry in head["series"]:
        data_class, n = int(entry["class"]), int(entry["points"])
        metadata = SummaryMetadata.FromString(_unb64(entry["metadata"]))
        steps, wall_times = array("q", next(records)), array("d", next(records))
        if data_class == DATA_CLASS_SCALAR:
            numbers = array("d", next(records))
            if not len(steps) == len(wall_times) == len(numbers) == n:
                raise ValueError(f"series {entry['tag']!r} of run {head['run']!r} has columns of other lengths")
            reservoir = Reservoir(int(entry["capacity"]), ScalarPoints.of(steps, wall_times, numbers))
            reservoir.resume(int(entry["seen"]))
            run.series[str(entry["tag"])] = Series(data_class, metadata, reservoir)
            continue
        reservoir = Reservoir(int(entry["capacity"]))
        reservoir.resume(int(entry["seen"]))
        values: list[Any]
        if data_class == DATA_CLASS_BLOB_SEQUENCE:
            values = [tuple(whole_records(next(records))) for _ in range(n)]
        else:
            values = [TensorProto.FromString(next(records)) for _ in range(n)]
        if not len(steps) == len(wall_times) == len(values) == n:
            raise ValueError(f"series {entry['tag']!r} of run {head['run']!r} has columns of other lengths")
        for datum in map(Datum, steps, wall_times, values):
            reservoir.items.append(datum)
        run.series[str(entry["tag"])] = Series(data_class, metadata, reservoir)
    marks = [FileMark(str(name), int(offset), _unb64(tail)) for name, offset, tail in head["files"]]
    return str(head["run"]), run, marks


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)
