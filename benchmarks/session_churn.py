"""A big job's sessions opening and closing: the daemon's CPU to open, then close, N sessions of one run.

    python -m benchmarks.session_churn [RANKS ...]       # default 4096 8192

One run of N workers (a session each, aggregation on), opened 64 at a time over gRPC, then closed the same way,
against a fresh daemon whose session limits are raised to N. Printed per N: the daemon's CPU (`/proc/<pid>/stat`)
and the wall time of each phase, and per session. What it shows: whether a session's open and close cost the same
at any size of job (a cost per session that grows with N is a scan of every live session).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc

from benchmarks._run import running_daemon
from benchmarks.sessions import process_cpu
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

_CONCURRENT = 64


async def _churn(address: str, ranks: int, pid: int) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.SummariesStub(channel)
        ids = [uuid.uuid4().hex for _ in range(ranks)]
        gate = asyncio.Semaphore(_CONCURRENT)

        async def open_session(rank: int) -> None:
            async with gate:
                request = pb.OpenSessionRequest(
                    session_id=ids[rank], run="job", worker=f"rank-{rank}", world_size=ranks, next_sequence=1
                )
                await stub.OpenSession(request, timeout=600)

        async def close_session(rank: int) -> None:
            async with gate:
                await stub.CloseSession(pb.CloseSessionRequest(session_id=ids[rank]), timeout=600)

        cpu, wall = process_cpu(pid), time.perf_counter()
        await asyncio.gather(*(open_session(rank) for rank in range(ranks)))
        opened_cpu, opened_wall = process_cpu(pid), time.perf_counter()
        await asyncio.gather(*(close_session(rank) for rank in range(ranks)))
        closed_cpu, closed_wall = process_cpu(pid), time.perf_counter()
    open_cpu, close_cpu = opened_cpu - cpu, closed_cpu - opened_cpu
    return (
        f"{ranks:,} sessions: open {open_cpu:.1f} s of daemon CPU ({opened_wall - wall:.1f} s), "
        f"{open_cpu / ranks * 1e3:.2f} ms each; close {close_cpu:.1f} s ({closed_wall - opened_wall:.1f} s), "
        f"{close_cpu / ranks * 1e3:.2f} ms each"
    )


def main(argv: list[str]) -> int:
    for ranks in [int(arg) for arg in argv] or [4096, 8192]:
        limit = str(ranks + 64)
        flags = ("--max-sessions", limit, "--max-sessions-per-peer", limit, "--max-open-runs", limit)
        with tempfile.TemporaryDirectory() as workdir, running_daemon(Path(workdir), *flags) as daemon:
            print(asyncio.run(_churn(daemon.address, ranks, daemon.pid)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
