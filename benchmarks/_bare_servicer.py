"""The floor of the job-shape benchmark: a bare `grpc.aio` servicer of the contract on uvloop that only acks.

`python -m benchmarks._bare_servicer --port-file FILE` listens on a loopback port the OS picks (written to FILE,
newline last, once it listens) and answers `OpenSession` and each `WriteRequest` as the daemon would, writing
nothing (`CloseSession` says how many events it was sent): what one Python process pays for gRPC's Python side
on the same messages, the daemon's floor. `running(workdir)` starts one for a benchmark and stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import uvloop
from grpc import aio

from _daemon import START_TIMEOUT, stop_process
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc


class BareSummaries(pb_grpc.SummariesServicer):
    """Acks every batch with its last sequence number; holds nothing but each session's count of events."""

    def __init__(self) -> None:
        self._events: dict[str, int] = {}

    async def OpenSession(self, request: pb.OpenSessionRequest, context: Any) -> pb.OpenSessionResponse:  # noqa: N802
        return pb.OpenSessionResponse(
            run_dir=f"{request.run}/{request.worker}",
            last_sequence=max(request.next_sequence - 1, 0),
            lease_seconds=60.0,
            max_batch_events=65_536,
            takes_scalar_columns=True,
        )

    async def Write(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.WriteRequest], context: Any
    ) -> AsyncIterator[pb.WriteAck]:
        acked = 0
        async for request in request_iterator:
            count = len(request.scalars.tag_index) or len(request.events)
            self._events[request.session_id] = self._events.get(request.session_id, 0) + count
            if count:
                acked = max(acked, request.first_sequence + count - 1)
            yield pb.WriteAck(acked_sequence=acked)

    async def CloseSession(self, request: pb.CloseSessionRequest, context: Any) -> pb.CloseSessionResponse:  # noqa: N802
        return pb.CloseSessionResponse(events_written=self._events.pop(request.session_id, 0))


@contextlib.contextmanager
def running(workdir: Path) -> Iterator[tuple[str, int]]:
    """A bare servicer in a process of its own, listening on loopback: its address and pid."""
    port_file = workdir / f"floor-port-{time.monotonic_ns()}"
    command = [sys.executable, "-m", "benchmarks._bare_servicer", "--port-file", str(port_file)]
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not (port_file.exists() and port_file.read_text().endswith("\n")):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the bare servicer did not start")
            time.sleep(0.02)
        yield f"127.0.0.1:{int(port_file.read_text())}", proc.pid
    finally:
        stop_process(proc)


async def serve(port_file: str) -> None:
    server = aio.server()
    pb_grpc.add_SummariesServicer_to_server(BareSummaries(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    with open(port_file, "w") as f:
        f.write(f"{port}\n")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(0)


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__)
    parser.add_argument("--port-file", required=True)
    uvloop.run(serve(parser.parse_args().port_file))


if __name__ == "__main__":
    main()
