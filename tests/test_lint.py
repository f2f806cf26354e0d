"""Our code stays ruff- and mypy-clean; these run with the rest of the suite, in CI too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_check() -> None:
    _run("ruff", "check", ".")


def test_ruff_format() -> None:
    _run(
        "ruff",
        "format",
        "--check",
        *(d for d in ("cli", "client", "server", "scripts", "tests", "benchmarks") if (ROOT / d).is_dir()),
    )


def test_mypy() -> None:
    _run("mypy")
