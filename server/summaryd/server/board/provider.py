"""TensorBoard reads the daemon: `tensorboard.data.TensorBoardDataProvider` over the board index.

`tensorboard --grpc_data_provider HOST:PORT` (no `--logdir`) asks this service for runs, tags and points. The
semantics are those TensorBoard's `grpc_provider` relies on and RustBoard serves: a filter absent means all,
a run or tag filter present means only those names, a plugin filter selects series by their plugin, and a
read returns at most `Downsample.num_points` points of a series, sampled uniformly with the newest always
among them (TensorBoard reads the latest value as a read of one point).
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Iterator, Sequence, Set
from typing import Any, Protocol, TypeVar

import grpc
from tensorboard.compat.proto.summary_pb2 import DATA_CLASS_BLOB_SEQUENCE, DATA_CLASS_SCALAR, DATA_CLASS_TENSOR
from tensorboard.data.proto import data_provider_pb2 as dp
from tensorboard.data.proto import data_provider_pb2_grpc as dp_grpc

from summaryd.server.board.index import (
    BoardIndex,
    Datum,
    Points,
    RunIndex,
    ScalarPoints,
    Series,
    blob_key,
    parse_blob_key,
)

log = logging.getLogger("summaryd.server.board")  # the name log lines carry, kept across moves

Context = grpc.aio.ServicerContext[Any, Any]


class _PerRun(Protocol):
    """A List or Read response: its entries per run."""

    @property
    def runs(self) -> Any: ...


_Response = TypeVar("_Response", bound=_PerRun)
BLOB_CHUNK_BYTES = 1 << 20  # one ReadBlob message: below gRPC's default 4 MiB limit of TensorBoard's channel


def sample_indices(n: int, k: int) -> Sequence[int]:
    """Which of `n` points, in order, a read of at most `k` returns: all when there are `k` or fewer, else the
    last and `k - 1` others drawn uniformly (seed 0, as TensorBoard's own provider draws them)."""
    if k <= 0:
        return ()
    if n <= k:
        return range(n)
    return [*sorted(random.Random(0).sample(range(n - 1), k - 1)), n - 1]


def downsample(items: Points, k: int) -> list[Datum]:
    """The points of `items` that `sample_indices` picks."""
    return [items[i] for i in sample_indices(len(items), k)]


class BoardService(dp_grpc.TensorBoardDataProviderServicer):  # type: ignore[misc]
    """The data provider over `index`; `location` is what TensorBoard shows as the data's place."""

    def __init__(self, index: BoardIndex, location: str, runs_prefix: str = "") -> None:
        self._index = index
        self._location = location
        self._prefix = runs_prefix.strip("/")

    def _runs(self, names: set[str] | None) -> Iterator[tuple[str, Any]]:
        if names is not None:
            self._index.asked(names)
        for name, run in self._index.snapshot() if names is None else self._index.named(names):
            if self._prefix and not (name == self._prefix or name.startswith(self._prefix + "/")):
                continue
            yield name, run

    def _series(self, request: Any, data_class: int) -> Iterator[tuple[str, Iterator[tuple[str, Series]]]]:
        """The (run, its matching series) pairs a List/Read request selects."""
        rtf = request.run_tag_filter
        runs = set(rtf.runs.names) if rtf.HasField("runs") else None
        tags = set(rtf.tags.names) if rtf.HasField("tags") else None
        plugin = request.plugin_filter.plugin_name
        for name, run in self._runs(runs):
            matching = _matching(run, data_class, plugin, tags)
            if matching:
                yield name, iter(matching)

    async def _num_points(self, request: Any, context: Context) -> int:
        k = int(request.downsample.num_points)
        if k < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"downsample.num_points is {k}; give 0 or more")
        return k

    def run_count(self) -> int:
        """The runs served (under `--board-runs`)."""
        return sum(1 for _ in self._runs(None))

    async def GetExperiment(self, request: dp.GetExperimentRequest, context: Context) -> dp.GetExperimentResponse:
        response = dp.GetExperimentResponse(data_location=self._location)
        starts = [run.start_time for _, run in self._runs(None) if run.start_time is not None]
        if starts:
            response.creation_time.FromNanoseconds(int(min(starts) * 1e9))
        return response

    async def ListPlugins(self, request: dp.ListPluginsRequest, context: Context) -> dp.ListPluginsResponse:
        plugins = frozenset[str]().union(*(run.plugins() for _, run in self._runs(None)))
        return dp.ListPluginsResponse(plugins=[dp.Plugin(name=p) for p in sorted(plugins)])

    async def ListRuns(self, request: dp.ListRunsRequest, context: Context) -> dp.ListRunsResponse:
        response = dp.ListRunsResponse()
        for name, run in self._runs(None):
            response.runs.add(name=name, start_time=run.start_time or 0.0)
        return response

    def _list(self, request: Any, response_type: type[Any], data_class: int) -> bytes:
        """A List response, serialized: each selected series' metadata and its largest step and wall time.

        Each run's part is kept serialized (`RunIndex.answers`) until the run changes: TensorBoard lists every
        run's every tag on each dashboard's load (`/data/plugin/scalars/tags`, Time Series' `tags`), and most
        runs of a large logdir are done. Serialized one-run responses, joined, are the whole response (a
        repeated field's entries concatenate), so nothing is built or parsed again for them."""
        rtf = request.run_tag_filter
        runs = set(rtf.runs.names) if rtf.HasField("runs") else None
        tags = frozenset(rtf.tags.names) if rtf.HasField("tags") else None
        question = (response_type, data_class, request.plugin_filter.plugin_name, tags)
        parts = []
        for name, run in self._runs(runs):
            answer = run.answers.get(question)
            if answer is None or answer[0] != run.changes:
                if len(run.answers) >= _ANSWERS_PER_RUN:
                    run.answers.clear()  # questions of other tag filters: bounded, and asked again cheaply
                answer = run.answers[question] = (run.changes, _run_listing(name, run, question))
            parts.append(answer[1])
        return b"".join(parts)

    async def _read(self, request: Any, context: Context, response: _Response, data_class: int) -> _Response:
        """Fill a Read response: at most `num_points` points of each selected series, the newest among them."""
        k = await self._num_points(request, context)
        for name, series in self._series(request, data_class):
            entry = response.runs.add(run_name=name)
            for tag, s in series:
                data = entry.tags.add(tag_name=tag).data
                items = s.reservoir.items
                if isinstance(items, ScalarPoints):  # column to column, no point built
                    steps, wall_times, values = items.columns(sample_indices(len(items), k))
                    data.step.extend(steps)
                    data.wall_time.extend(wall_times)
                    data.value.extend(values)
                    continue
                chosen = downsample(items, k)
                data.step.extend(d.step for d in chosen)
                data.wall_time.extend(d.wall_time for d in chosen)
                for d in chosen:
                    if data_class == DATA_CLASS_SCALAR:
                        data.value.append(d.value)
                    elif data_class == DATA_CLASS_TENSOR:
                        data.value.add().CopyFrom(d.value)
                    elif isinstance(d.value, tuple):
                        refs = data.values.add()
                        for i in range(len(d.value)):
                            refs.blob_refs.add(blob_key=blob_key(name, tag, d.step, i))
        return response

    async def ListScalars(self, request: dp.ListScalarsRequest, context: Context) -> bytes:
        return self._list(request, dp.ListScalarsResponse, DATA_CLASS_SCALAR)

    async def ReadScalars(self, request: dp.ReadScalarsRequest, context: Context) -> dp.ReadScalarsResponse:
        return await self._read(request, context, dp.ReadScalarsResponse(), DATA_CLASS_SCALAR)

    async def ListTensors(self, request: dp.ListTensorsRequest, context: Context) -> bytes:
        return self._list(request, dp.ListTensorsResponse, DATA_CLASS_TENSOR)

    async def ReadTensors(self, request: dp.ReadTensorsRequest, context: Context) -> dp.ReadTensorsResponse:
        return await self._read(request, context, dp.ReadTensorsResponse(), DATA_CLASS_TENSOR)

    async def ListBlobSequences(self, request: dp.ListBlobSequencesRequest, context: Context) -> bytes:
        return self._list(request, dp.ListBlobSequencesResponse, DATA_CLASS_BLOB_SEQUENCE)

    async def ReadBlobSequences(
        self, request: dp.ReadBlobSequencesRequest, context: Context
    ) -> dp.ReadBlobSequencesResponse:
        return await self._read(request, context, dp.ReadBlobSequencesResponse(), DATA_CLASS_BLOB_SEQUENCE)

    async def ReadBlob(self, request: dp.ReadBlobRequest, context: Context) -> AsyncIterator[dp.ReadBlobResponse]:
        try:
            run_name, tag, step, index = parse_blob_key(request.blob_key)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        blob = self._blob(run_name, tag, step, index)
        if blob is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no blob {index} at step {step} of run {run_name!r} tag {tag!r} (sampled out, or never logged)",
            )
        for at in range(0, max(len(blob), 1), BLOB_CHUNK_BYTES):
            yield dp.ReadBlobResponse(data=blob[at : at + BLOB_CHUNK_BYTES])

    def _blob(self, run_name: str, tag: str, step: int, index: int) -> bytes | None:
        for _, run in self._runs({run_name}):
            s = run.series.get(tag)
            if s is None or s.data_class != DATA_CLASS_BLOB_SEQUENCE:
                return None
            for d in s.reservoir.items:
                if d.step == step and isinstance(d.value, tuple) and 0 <= index < len(d.value):
                    blob: bytes = d.value[index]
                    return blob
        return None


_ANSWERS_PER_RUN = 16
RAW_ANSWERS = ("ListScalars", "ListTensors", "ListBlobSequences")
"""The methods whose answers are serialized already (`BoardService._list`)."""


def _matching(run: RunIndex, data_class: int, plugin: str, tags: Set[str] | None) -> list[tuple[str, Series]]:
    """The run's series of `data_class` and `plugin` (among `tags`, when given), by tag."""
    return [
        (tag, s)
        for tag, s in sorted(run.series.items())
        if s.data_class == data_class and s.plugin == plugin and (tags is None or tag in tags)
    ]


def _run_listing(name: str, run: RunIndex, question: tuple[type[Any], int, str, frozenset[str] | None]) -> bytes:
    """One run's List response (of `response_type`) serialized: its series of `data_class` and `plugin`
    (among `tags`, when given) with their metadata; empty when none match."""
    response_type, data_class, plugin, tags = question
    matching = _matching(run, data_class, plugin, tags)
    if not matching:
        return b""
    response = response_type()
    entry = response.runs.add(run_name=name)
    for tag, s in matching:
        metadata = entry.tags.add(tag_name=tag).metadata
        metadata.max_step, metadata.max_wall_time = s.max_step, s.max_wall_time
        if data_class == DATA_CLASS_BLOB_SEQUENCE:
            metadata.max_length = s.max_length
        metadata.summary_metadata.CopyFrom(s.metadata)
    data: bytes = response.SerializeToString()
    return data


def add_board_service(service: BoardService, server: grpc.aio.Server) -> None:
    """Serve `service` on `server`: as the generated `add_TensorBoardDataProviderServicer_to_server` does, but
    the `RAW_ANSWERS` methods' bytes go out as they are."""
    descriptor = dp.DESCRIPTOR.services_by_name["TensorBoardDataProvider"]
    handlers = {}
    for method in descriptor.methods:
        request_type, response_type = getattr(dp, method.input_type.name), getattr(dp, method.output_type.name)
        serialize = bytes if method.name in RAW_ANSWERS else response_type.SerializeToString
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(
            getattr(service, method.name), request_deserializer=request_type.FromString, response_serializer=serialize
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(descriptor.full_name, handlers),))
