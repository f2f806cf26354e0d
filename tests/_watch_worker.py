"""One training process as the watch tests start it: `python _watch_worker.py SPEC`.

SPEC is JSON: `address`, `run`, `rank`, `world`, `step_secs` (sleep per step), `seed`, and `until` (a file: log
until it exists, then close). A steady noisy loss `loss` and `acc` are logged every step, unless: `nan` (from
that step on, until the file `heal` exists, `loss` is NaN), `diverge` (from that step on, until `heal` exists,
`loss` grows 1.5x a step), `slow` (a file: while it exists, each step sleeps `slow_secs` more). After a step
listed in `mark` the worker flushes and touches `<until>.<worker>.at-<step>`.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from summaryd.client import SummaryWriter


def main() -> None:
    spec = json.loads(sys.argv[1])
    rank, until = spec["rank"], Path(spec["until"])
    rng = random.Random(spec.get("seed", 0) * 1000 + rank)
    worker = f"rank-{rank}" if spec.get("world", 1) > 1 else ""
    writer = SummaryWriter(spec["run"], address=spec["address"], worker=worker, world_size=spec.get("world", 1))
    nan, diverge, slow = spec.get("nan"), spec.get("diverge"), spec.get("slow")
    heal = Path(spec.get("heal", until))
    marks = set(spec.get("mark", []))
    step, grown = 0, 1.0
    while not until.exists():
        loss = 1.0 / (1.0 + 0.01 * step) + 0.02 * rng.random()
        sick = not heal.exists()
        if diverge is not None and step >= diverge and sick:
            grown *= 1.5
            loss *= grown
        if nan is not None and step >= nan and sick:
            loss = float("nan")
        writer.add_scalar("loss", loss, step)
        writer.add_scalar("acc", 0.5 + 0.001 * step, step)
        if step in marks:
            writer.flush(timeout=10)
            Path(f"{until}.{worker or 'writer'}.at-{step}").touch()
        time.sleep(spec["step_secs"] + (spec.get("slow_secs", 0.0) if slow and Path(slow).exists() else 0.0))
        step += 1
    report = writer.close(timeout=60)
    assert report.ok, report


if __name__ == "__main__":
    main()
