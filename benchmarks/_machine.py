"""Facts about the machine and the software a run measured, printed above its figures."""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

_PACKAGES = ("summaryd", "torch", "tensorboardX", "tensorboard", "grpcio", "protobuf", "google-crc32c", "uvloop")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory() -> str:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _tensorflow() -> str:
    """Whether TensorFlow is importable: with it, torch's writer and TensorBoard's loader go through
    `tf.io.gfile`, which moves the torch and visibility rows several times over (RESULTS.md, *Full run, commit
    e6cb3fb*)."""
    for name in ("tensorflow-cpu", "tensorflow"):
        version = _version(name)
        if version != "not installed":
            return f"{name} {version}: torch's writer and TensorBoard's loader use tf.io.gfile"
    return "not installed"


def summaryd_tree() -> Path | None:
    """The source tree `summaryd.client` is imported from (an editable install's checkout, or `PYTHONPATH`)."""
    spec = importlib.util.find_spec("summaryd.client")
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin).resolve()  # <tree>/client/summaryd/client/__init__.py when run from a tree
    return origin.parents[3] if origin.parents[2].name == "client" else origin.parents[1]


def _git(root: Path) -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "client", "server", "proto"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    if not changed:
        return f"{head} (client/, server/, proto/ as committed)"
    # The figures are of the working tree: name what differs from the commit.
    paths = [line[3:] for line in changed if line.strip()]
    return f"{head} plus uncommitted changes to {', '.join(paths)}"


def facts() -> list[tuple[str, str]]:
    tree = summaryd_tree()
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [
        ("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("cpus (nproc)", str(affinity)),
        ("cpu model", _cpu_model()),
        ("memory", _memory()),
        ("os", f"{platform.system()} {platform.release()}"),
        ("python", f"{platform.python_implementation()} {sys.version.split()[0]}"),
        ("packages", ", ".join(f"{name} {_version(name)}" for name in _PACKAGES)),
        ("tensorflow", _tensorflow()),
        ("summaryd measured", str(tree) if tree else "not found"),
        ("its commit", _git(tree) if tree else "unknown"),
        ("load average", load_average()),
    ]


def load_average() -> str:
    """1, 5 and 15 minute load: anything well above 0 means something else shared the CPUs."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"
