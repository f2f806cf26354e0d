"""One worker of a multi-worker job, as the aggregation tests start it: `python _aggregate_worker.py SPEC`.

SPEC is JSON: `address`, `run`, `rank`, `world`, `steps` ([start, stop]), `barrier` (a directory: the worker
says it is ready there and waits until all `world` workers are), optional `stall` ({"at": step, "go": file}:
flush, say so in the barrier directory, and wait for `go` before logging that step), `summary` (log through
`add_summary` as serialized `Summary` protos instead of `add_scalar`'s columns), `scalars_steps` (that many
steps of `add_scalars("parts", {"a": v, "b": -v})` too) and `pause` (seconds to sleep every 100 steps, so that
a job lasts long enough for a fault to strike it mid-run).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tensorboard.compat.proto.summary_pb2 import Summary

from summaryd.client import SummaryWriter


def value(rank: int, step: int) -> float:
    """The known value worker `rank` logs at `step`: a multiple of 1/4, so that every reduction is exact."""
    return (step % 97) * 0.5 + rank * 0.25 - 7.0


def _wait(path: Path, count: int = 1, pattern: str = "") -> None:
    while (len(list(path.glob(pattern))) if pattern else int(path.exists())) < count:
        time.sleep(0.01)


def main() -> None:
    spec = json.loads(sys.argv[1])
    rank, world, barrier = spec["rank"], spec["world"], Path(spec["barrier"])
    writer = SummaryWriter(
        spec["run"], address=spec["address"], worker=f"rank-{rank}", world_size=world, backoff_secs=(0.05, 0.5)
    )
    (barrier / f"ready-{rank}").touch()
    _wait(barrier, world, "ready-*")
    stall = spec.get("stall")
    for step in range(*spec["steps"]):
        if stall is not None and step == stall["at"]:
            writer.flush(timeout=10)
            (barrier / f"stalled-{rank}").touch()
            _wait(Path(stall["go"]))
        if step % 100 == 0 and spec.get("pause"):
            time.sleep(spec["pause"])
        v = value(rank, step)
        if spec.get("summary"):
            writer.add_summary(Summary(value=[Summary.Value(tag="loss", simple_value=v)]), step)
        else:
            writer.add_scalar("loss", v, step)
        if step < spec.get("scalars_steps", 0):
            writer.add_scalars("parts", {"a": v, "b": -v}, step)
    report = writer.close(timeout=60)
    assert report.ok, report


if __name__ == "__main__":
    main()
