"""Which hook classes `summaryd.client` hands out when TensorFlow is absent or broken.

These run in the quick tier, with or without TensorFlow installed: each starts a fresh interpreter that hides
TensorFlow (`sys.modules["tensorflow"] = None`, which makes it unfindable) or shadows it with a package that
fails to import. With a working TensorFlow the hooks are its subclasses: `tests/test_tf_hooks.py` (slow tier).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_python(script: str, extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(extra_path), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, env=env)


def test_without_tensorflow_the_hooks_are_the_plain_ones() -> None:
    done = run_python(
        """
import sys
sys.modules["tensorflow"] = None  # not installed, as far as importlib can tell
import summaryd.client
from summaryd.client import hooks
assert summaryd.client.SummarySaverHook is hooks.SummarySaverHook is hooks.PlainSummarySaverHook
assert summaryd.client.StepCounterHook is hooks.StepCounterHook is hooks.PlainStepCounterHook
print("plain")
"""
    )
    assert done.returncode == 0 and done.stdout.strip() == "plain", done.stderr


def test_a_tensorflow_that_fails_to_import_leaves_the_plain_hooks_and_says_why(tmp_path: Path) -> None:
    """An installed TensorFlow that raises ImportError (a broken wheel, a missing shared library) must not make
    the hooks unusable: they fall back to the plain ones and a warning names the error."""
    broken = tmp_path / "site" / "tensorflow"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("libtensorflow_framework.so.2: cannot open")\n')
    done = run_python(
        """
import logging
logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
import summaryd.client
from summaryd.client import hooks
assert summaryd.client.SummarySaverHook is hooks.PlainSummarySaverHook
assert summaryd.client.StepCounterHook is hooks.PlainStepCounterHook
print("plain")
""",
        extra_path=tmp_path / "site",
    )
    assert done.returncode == 0 and done.stdout.strip() == "plain", done.stderr
    assert (
        "summaryd.client WARNING TensorFlow is installed but does not import "
        "(libtensorflow_framework.so.2: cannot open); the hooks work without it"
    ) in done.stderr
