"""Every benchmark still runs (at a tiny size); the figures themselves live in benchmarks/RESULTS.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_benchmarks_run_at_smoke_size(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--smoke", "--json", str(tmp_path / "figures.json")],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "figures.json").stat().st_size > 0
    assert "ratio" in result.stdout.lower()
