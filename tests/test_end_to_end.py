"""Several training processes log through one daemon; TensorBoard's readers see every point exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from _support import Daemon, event_files, read_events

STEPS = 300

WORKER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from summaryd.client import SummaryWriter

    steps = int(sys.argv[1])
    rank = int(__import__("os").environ["RANK"])
    # Address and worker label come from the environment; the workers' runs alone (no cross-worker aggregates).
    with SummaryWriter("exp", aggregate=False) as writer:
        for step in range(steps):
            writer.add_scalar("loss", rank * 1000 + step, step)
            if step % 10 == 0:
                writer.add_histogram("weights", np.random.default_rng(step).normal(size=500), step)
            if step % 50 == 0:
                writer.add_image("sample", np.full((3, 8, 8), step % 256, dtype=np.uint8), step)
                writer.add_text("note", f"rank {rank} step {step}", step)
        report = writer.close()
    print(json.dumps({"delivered": report.delivered, "undelivered": report.undelivered,
                      "dropped": dict(report.dropped), "synced": report.synced}))
    """
)


def _run_workers(daemon: Daemon, world: int) -> list[dict[str, object]]:
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "SUMMARYD_ADDRESS": daemon.address}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, str(STEPS)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def test_four_workers_each_get_one_complete_event_file(daemon: Daemon) -> None:
    """Each rank lands in `exp/rank-N`, one file, file_version first, every point once and in order."""
    reports = _run_workers(daemon, world=4)
    per_worker = STEPS + STEPS // 10 + 2 * (STEPS // 50)
    for report in reports:
        assert report == {"delivered": per_worker, "undelivered": 0, "dropped": {}, "synced": True}

    run_dirs = sorted(p.name for p in (daemon.logdir / "exp").iterdir())
    assert run_dirs == ["rank-0", "rank-1", "rank-2", "rank-3"]
    for rank in range(4):
        run_dir = daemon.logdir / "exp" / f"rank-{rank}"
        files = event_files(run_dir)
        assert len(files) == 1, files
        events = read_events(files[0])
        assert events[0].file_version == "brain.Event:2"
        assert sum(e.HasField("file_version") for e in events) == 1
        assert len(events) == 1 + per_worker

        accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
        accumulator.Reload()
        loss = accumulator.Scalars("loss")
        assert [p.step for p in loss] == list(range(STEPS))
        assert [p.value for p in loss] == [rank * 1000 + s for s in range(STEPS)]
        assert [t.step for t in accumulator.Tensors("weights")] == list(range(0, STEPS, 10))
        assert [i.step for i in accumulator.Images("sample")] == list(range(0, STEPS, 50))
        notes = accumulator.Tensors("note")
        assert [t.step for t in notes] == list(range(0, STEPS, 50))
        assert notes[1].tensor_proto.string_val == [f"rank {rank} step 50".encode()]


def test_single_process_writes_the_run_directory_itself(daemon: Daemon, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Without a launcher environment the run has no worker sub-directory."""
    from summaryd.client import SummaryWriter

    for name in ("RANK", "WORLD_SIZE", "TF_CONFIG", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    with SummaryWriter("solo", address=daemon.address) as writer:
        writer.add_scalar("x", 1.5, 7)
    files = event_files(daemon.logdir / "solo")
    assert len(files) == 1
    scalars = [(e.step, v.tag, v.simple_value) for e in read_events(files[0]) for v in e.summary.value]
    assert scalars == [(7, "x", 1.5)]


def test_a_new_session_on_the_same_run_gets_a_file_that_sorts_last(daemon: Daemon) -> None:
    """A restarted client writes a new file TensorBoard reads after the old one."""
    from summaryd.client import SummaryWriter

    for attempt in range(3):
        with SummaryWriter("restarted", address=daemon.address, worker="") as writer:
            writer.add_scalar("attempt", attempt, attempt)
    files = event_files(daemon.logdir / "restarted")
    assert len(files) == 3
    assert [f.name for f in files] == sorted(f.name for f in files)
    values = [v.simple_value for f in files for e in read_events(f) for v in e.summary.value]
    assert values == [0.0, 1.0, 2.0]


def test_status_lists_runs_and_sessions(daemon: Daemon) -> None:
    """`summaryd status --json` shows a live session with its run and counts."""
    from summaryd.client import SummaryWriter

    writer = SummaryWriter("watched", address=daemon.address, worker="")
    writer.add_scalar("x", 1.0, 1)
    assert writer.flush(timeout=10).delivered == 1
    out = subprocess.run(
        [sys.executable, "-m", "summaryd.server", "status", "--json", "--address", daemon.address],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    status = json.loads(out)
    assert [r["run_dir"] for r in status["runs"]] == ["watched"]
    [session] = status["sessions"]
    assert session["run_dir"] == "watched" and session["events_written"] == 1
    assert session["client"]["pid"] == os.getpid()
    writer.close()
    assert Path(daemon.logdir / "watched").is_dir()
