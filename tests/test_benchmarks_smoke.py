"""Every benchmark still runs (at a tiny size); the figures themselves live in benchmarks/RESULTS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _smoke(*options: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`python benchmarks/run.py --smoke` with `options`."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--smoke", *options],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )


@pytest.mark.slow  # about 3 minutes on 2 cores (a process per trial, torch imported in many): the slow tier
@pytest.mark.timeout(960)
def test_benchmarks_run_at_smoke_size(tmp_path: Path) -> None:
    result = _smoke("--json", str(tmp_path / "figures.json"), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "figures.json").stat().st_size > 0
    assert "ratio" in result.stdout.lower()
    for row in (
        "add_histogram (",
        "add_image (",
        "add_summary (serialized, the hooks) (",
        "### 9. Many sessions",
        "### 10. Daemon CPU of cross-worker aggregation",
        "### 12. Daemon CPU of the watch",
        "### 15. The job shape",
    ):
        assert row in result.stdout, row


@pytest.mark.timeout(120)
def test_many_sessions_rows_measure_the_daemon_backlog_and_rss(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"
    result = _smoke("--only", "sessions", "--json", str(figures_file), timeout=110)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(figures_file.read_text())
    rows = figures["results"]["sessions"]
    assert [row["sessions"] for row in rows] == list(figures["plan"]["session_counts"])
    for row in rows:
        assert row["events"] > 0 and row["daemon_cpu_s"] > 0
        assert row["rss_start_mb"] > 0 and row["rss_end_mb"] > 0
        assert row["samples"] and row["backlog_max"] >= row["backlog_end"] >= 0
    targets = [target["name"] for target in figures["targets"]]
    last = rows[-1]["sessions"]
    for name in ("acknowledged vs offered", "backlog growth, seconds of load", "daemon RSS growth, MB"):
        assert any(t.startswith(f"{last} sessions") and name in t for t in targets), name
    assert sum("daemon CPU per scalar" in t for t in targets) == len(rows)
    assert "backlog start → end (max)" in result.stdout


@pytest.mark.slow  # four daemons and their generators for a few seconds each
@pytest.mark.timeout(300)
def test_the_job_shape_benchmark_runs_short() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.job_shape", "--short"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| 8 ")]
    for target in ("bare servicer (floor)", "daemon, aggregation on", "daemon, aggregation off", "no pacing"):
        [row] = [r for r in rows if f" {target} |" in r]
        # Eight workers are far below any target's capacity: every scalar of the window is acknowledged within
        # the grace, whatever phase of a linger the window ends on.
        assert [cell.strip() for cell in row.split("|")][5] == "1.000x", row


@pytest.mark.slow  # three TensorBoards started twice
@pytest.mark.timeout(600)
def test_the_board_benchmark_runs_at_a_tiny_size() -> None:
    for options in (["--points", "5", "--wait-s", "12"], ["--startup", "--runs", "2", "--tags", "2", "--steps", "20"]):
        result = subprocess.run(
            [sys.executable, "-m", "benchmarks.board", *options],
            capture_output=True,
            text=True,
            timeout=540,
            check=False,
            cwd=ROOT,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "TensorBoard on the board (--grpc_data_provider)" in result.stdout
        assert "RustBoard (--logdir, --load_fast=true)" in result.stdout
        assert "not within" not in result.stdout, result.stdout
