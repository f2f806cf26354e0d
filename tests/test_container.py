"""The container image: built from docker/Dockerfile, run with a volume, health-checked, stopped cleanly.

Slow tier. Docker Hub is out of reach here, so the test makes its own base image: a `debootstrap --variant=minbase`
Debian bookworm with python3, imported into podman (cached across runs in SUMMARYD_CI_CACHE, default
/var/cache/summaryd-ci). The Dockerfile itself is the standard one, only BASE_IMAGE is swapped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from _support import assert_whole_records, event_files, read_events, unused_port, wait_healthy
from summaryd.client import SummaryWriter

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("SUMMARYD_CI_CACHE", "/var/cache/summaryd-ci"))
BASE_IMAGE = "localhost/summaryd-test-base:bookworm"
IMAGE = "localhost/summaryd:test"
PODMAN_RUN_FLAGS = [
    "--runtime",
    "runc",
    "--network",
    "host",
    "--ulimit",
    "nofile=20000:20000",
    "--ulimit",
    "nproc=32768:32768",
]
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _sh(*args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def _ensure_base_image() -> None:
    if _sh("podman", "image", "exists", BASE_IMAGE, check=False).returncode == 0:
        return
    rootfs = CACHE / "rootfs-bookworm-python"
    done = CACHE / "rootfs-bookworm-python.done"
    if not done.exists():
        shutil.rmtree(rootfs, ignore_errors=True)
        rootfs.parent.mkdir(parents=True, exist_ok=True)
        _sh(
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv,python3-pip,ca-certificates",
            "bookworm",
            str(rootfs),
            "http://deb.debian.org/debian",
            timeout=1200,
        )
        done.touch()
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        subprocess.run(
            ["podman", "import", "-", BASE_IMAGE], stdin=tar.stdout, check=True, capture_output=True, timeout=600
        )
    finally:
        if tar.stdout:
            tar.stdout.close()
        tar.wait()


@pytest.fixture(scope="module")
def image() -> str:
    for tool in ("podman", "runc", "debootstrap"):
        assert shutil.which(tool), f"{tool} is not installed; .ci/run installs it with apt-get"
    _ensure_base_image()
    build = [
        "podman",
        "build",
        "--runtime",
        "runc",
        "--network",
        "host",
        "--build-arg",
        f"BASE_IMAGE={BASE_IMAGE}",
        "-f",
        str(ROOT / "docker" / "Dockerfile"),
        "-t",
        IMAGE,
    ]
    if CA_BUNDLE.exists():
        build += ["--secret", f"id=pip-ca,src={CA_BUNDLE}"]
    _sh(*build, str(ROOT), timeout=1200)
    return IMAGE


@pytest.fixture
def container(image: str, tmp_path: Path) -> Iterator[tuple[str, Path, str]]:
    logdir = tmp_path / "volume"
    logdir.mkdir()
    os.chown(logdir, 10001, 10001)  # the image's unprivileged user owns the volume, as on a real host
    port = unused_port()
    container_id = _sh(
        "podman",
        "run",
        "-d",
        *PODMAN_RUN_FLAGS,
        "-e",
        f"SUMMARYD_LISTEN=127.0.0.1:{port}",
        "-e",
        "SUMMARYD_SHUTDOWN_TIMEOUT=10",
        "-v",
        f"{logdir}:/logs",
        image,
    ).stdout.strip()
    try:
        yield container_id, logdir, f"127.0.0.1:{port}"
    finally:
        _sh("podman", "rm", "-f", "-t", "0", container_id, check=False)


def test_image_serves_a_host_client_and_stops_cleanly(container: tuple[str, Path, str]) -> None:
    """Host client → container daemon → files in the volume; health passes inside; SIGTERM exits 0, flushed."""
    container_id, logdir, address = container
    wait_healthy(address, timeout=60)
    health = _sh("podman", "exec", container_id, "summaryd", "health", "--address", address)
    assert "SERVING" in health.stdout
    user = _sh("podman", "exec", container_id, "id", "-u").stdout.strip()
    assert user == "10001", "the daemon must not run as root"

    writer = SummaryWriter("from-host", address=address, worker="")
    for step in range(500):
        writer.add_scalar("loss", 1.0 / (step + 1), step)
    assert writer.flush(timeout=30).delivered == 500
    # Left open on purpose: the stop must flush and sync what this live session wrote.
    _sh("podman", "stop", "-t", "30", container_id, timeout=60)
    state = _sh("podman", "inspect", "--format", "{{.State.ExitCode}}", container_id).stdout.strip()
    logs = _sh("podman", "logs", container_id).stderr + _sh("podman", "logs", container_id).stdout
    assert state == "0", logs
    assert "SIGTERM received" in logs and "stopped" in logs
    writer.close(timeout=1)

    [path] = event_files(logdir / "from-host")
    assert assert_whole_records(path) == 501
    assert [e.step for e in read_events(path) if e.HasField("summary")] == list(range(500))
