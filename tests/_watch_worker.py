"""One training process as the watch tests start it: `python _watch_worker.py SPEC`.

SPEC is JSON: `address`, `run`, `rank`, `world`, `step_secs` (sleep per step), `seed`, and `until` (a file: log
until it exists, then close). A steady noisy loss `loss` and `acc` are logged every step, unless: `nan` (from
that step on, until the file `heal` exists, `loss` is NaN), `diverge` (from that step on, until `heal` exists,
`loss` grows 1.5x a step), `slow` (a file: while it exists, each step sleeps `slow_secs` more). After a step
listed in `mark` the worker flushes and touches `<until>.<worker>.at-<step>`. With `summary`, `loss` goes as a
serialized `Summary` (`add_summary`, as the hooks send it) instead of `add_scalar`'s columns.

For the benchmarks: `nan_on` (a file: while it exists `loss` is NaN; the wall time of the first NaN logged goes
to `<nan_on>.logged`), and `realistic` (a loss as a training run's: an exponential decay to a floor, 5% Gaussian
noise, a lone spike of up to 3x now and then, `grad_norm` and `lr` beside it, each step's time jittered by 20%
and, every `eval_every` steps, a pause of `eval_secs` that logs `val_loss`).
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from pathlib import Path

from tensorboard.compat.proto.summary_pb2 import Summary

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
    nan_on = Path(spec["nan_on"]) if "nan_on" in spec else None
    realistic = spec.get("realistic", False)
    eval_every, eval_secs = spec.get("eval_every", 0), spec.get("eval_secs", 0.0)
    step, grown, nan_logged = 0, 1.0, False
    while not until.exists():
        loss = 1.0 / (1.0 + 0.01 * step) + 0.02 * rng.random()
        if realistic:
            loss = (2.0 * math.exp(-step / 2000) + 0.3) * (1 + 0.05 * rng.gauss(0.0, 1.0))
            if rng.random() < 0.005:
                loss *= 1 + 2 * rng.random()  # a lone spike, as a hard batch gives
            writer.add_scalar("grad_norm", abs(rng.gauss(1.0, 0.3)) * loss, step)
            writer.add_scalar("lr", 1e-3 * min(1.0, (step + 1) / 500), step)
        sick = not heal.exists()
        if diverge is not None and step >= diverge and sick:
            grown *= 1.5
            loss *= grown
        if nan is not None and step >= nan and sick:
            loss = float("nan")
        if nan_on is not None and nan_on.exists():
            loss = float("nan")
        if spec.get("summary"):
            writer.add_summary(Summary(value=[Summary.Value(tag="loss", simple_value=loss)]), step)
        else:
            writer.add_scalar("loss", loss, step)
        if nan_on is not None and not nan_logged and math.isnan(loss):
            nan_logged = True
            Path(f"{nan_on}.logged").write_text(repr(time.time()))
        writer.add_scalar("acc", 0.5 + 0.001 * step, step)
        if step in marks:
            writer.flush(timeout=10)
            Path(f"{until}.{worker or 'writer'}.at-{step}").touch()
        pause = spec["step_secs"] * (1 + 0.2 * (rng.random() - 0.5) if realistic else 1)
        if eval_every and step and step % eval_every == 0:
            time.sleep(eval_secs)
            writer.add_scalar("val_loss", loss * (1 + 0.02 * rng.random()), step)
        time.sleep(pause + (spec.get("slow_secs", 0.0) if slow and Path(slow).exists() else 0.0))
        step += 1
    report = writer.close(timeout=60)
    assert report.ok, report


if __name__ == "__main__":
    main()
