"""The container image: built from docker/Dockerfile, run with a volume, health-checked, stopped cleanly; and
docker/compose.yaml's `bucket` profile (SeaweedFS, two daemons on one bucket, TensorBoard reading it) run for real
with podman-compose.

Slow tier. Docker Hub is out of reach here, so the test makes its own base image: a `debootstrap --variant=minbase`
Debian bookworm with python3, imported into podman (cached across runs in SUMMARYD_CI_CACHE, default
/var/cache/summaryd-ci). The Dockerfiles themselves are the standard ones, only BASE_IMAGE is swapped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from _support import (
    assert_whole_records,
    event_files,
    log_losses,
    read_events,
    unused_port,
    wait_for,
    wait_healthy,
)
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
COMPOSE_FILE = ROOT / "docker" / "compose.yaml"
# The compose file's host ports (all on loopback), each moved to a free port for the test's project.
COMPOSE_PORTS = (
    "PORT_SUMMARYD",
    "PORT_TENSORBOARD",
    "PORT_S3",
    "PORT_SUMMARYD_A",
    "PORT_SUMMARYD_B",
    "PORT_TENSORBOARD_BUCKET",
)

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
    _sh(*build, *_ca_secret(), str(ROOT), timeout=1200)
    return IMAGE


def _ca_secret() -> list[str]:
    """The build secret that gives pip this machine's CA bundle (a TLS-intercepting proxy), when there is one."""
    return ["--secret", f"id=pip-ca,src={CA_BUNDLE}"] if CA_BUNDLE.exists() else []


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


@dataclass
class ComposeProject:
    """One podman-compose project of docker/compose.yaml with the `bucket` profile, on ports of its own."""

    name: str
    ports: dict[str, int]
    podman_compose: str

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        # runc here cannot raise the default container rlimits, so runs pass them explicitly (as PODMAN_RUN_FLAGS);
        # builds take the debootstrapped base and the CA bundle, as the image fixture's build does.
        command = [
            self.podman_compose,
            "-f",
            str(COMPOSE_FILE),
            "-p",
            self.name,
            "--profile",
            "bucket",
            "--podman-build-args",
            " ".join(["--runtime", "runc", "--network", "host", *_ca_secret()]),
            "--podman-run-args",
            "--ulimit nofile=20000:20000 --ulimit nproc=32768:32768",
            *args,
        ]
        env = {**os.environ, **{name: str(port) for name, port in self.ports.items()}}
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, env=env)
        if check and result.returncode != 0:
            raise AssertionError(
                f"podman-compose {' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}"
            )
        return result

    def address(self, port_name: str) -> str:
        return f"127.0.0.1:{self.ports[port_name]}"

    def container(self, service: str) -> str:
        label = "label=io.podman.compose.project=" + self.name
        found = _sh(
            "podman",
            "ps",
            "-a",
            "--filter",
            label,
            "--filter",
            f"label=com.docker.compose.service={service}",
            "--format",
            "{{.Names}}",
        ).stdout.split()
        assert len(found) == 1, f"{service}: containers {found}"
        return found[0]

    def remove_leftovers(self) -> None:
        """What a failed `down` left of this project (and only of it), found by its label."""
        label = "label=io.podman.compose.project=" + self.name
        ids = _sh("podman", "ps", "-a", "-q", "--filter", label, check=False).stdout.split()
        if ids:
            _sh("podman", "rm", "-f", "-t", "0", *ids, check=False)
        volumes = _sh("podman", "volume", "ls", "-q", "--filter", label, check=False).stdout.split()
        if volumes:
            _sh("podman", "volume", "rm", "-f", *volumes, check=False)
        networks = _sh("podman", "network", "ls", "-q", "--filter", label, check=False).stdout.split()
        if networks:
            _sh("podman", "network", "rm", "-f", *networks, check=False)
        _sh("podman", "pod", "rm", "-f", "--ignore", f"pod_{self.name}", check=False)  # podman-compose's pod


def _distinct_unused_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = unused_port()
        if port not in ports:
            ports.append(port)
    return ports


@pytest.fixture
def bucket_project() -> Iterator[ComposeProject]:
    """`podman-compose --profile bucket up -d` under a unique project name; then down with its volumes."""
    for tool in ("podman", "runc", "debootstrap"):
        assert shutil.which(tool), f"{tool} is not installed; .ci/run installs it with apt-get"
    podman_compose = shutil.which("podman-compose", path=str(Path(sys.executable).parent)) or shutil.which(
        "podman-compose"
    )
    assert podman_compose, "podman-compose is not installed; .ci/run installs it with pip"
    _ensure_base_image()
    project = ComposeProject(
        f"summaryd-test-{uuid.uuid4().hex[:8]}",
        dict(zip(COMPOSE_PORTS, _distinct_unused_ports(len(COMPOSE_PORTS)), strict=True)),
        podman_compose,
    )
    project.run("build", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", timeout=1200)
    try:
        project.run("up", "-d")
        yield project
    finally:
        project.run("down", "--volumes", "-t", "20", check=False)
        project.remove_leftovers()


def _scalars(tensorboard: str, run: str, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every point TensorBoard serves for `run`/`tag` (none while it does not know them)."""
    query = urllib.parse.urlencode({"run": run, "tag": tag})
    try:
        with urllib.request.urlopen(f"http://{tensorboard}/data/plugin/scalars/scalars?{query}", timeout=5) as answer:
            points: list[Any] = json.load(answer)
    except OSError:  # not serving yet: refused, reset, timed out, or 404 for a run it does not know yet
        return []
    return [(point[1], point[2]) for point in points]


def test_compose_bucket_profile_serves_two_daemons_on_one_bucket_through_its_tensorboard(
    bucket_project: ComposeProject,
) -> None:
    """Different runs land through either daemon; the same run from a client of the other daemon is refused
    there, follows the owner's advertised address and is written by one daemon only; the profile's TensorBoard
    serves every scalar from the bucket while the writers are still open."""
    project = bucket_project
    a, b = project.address("PORT_SUMMARYD_A"), project.address("PORT_SUMMARYD_B")
    for address in (a, b, project.address("PORT_SUMMARYD")):  # the default pair runs beside the profile
        wait_healthy(address, timeout=180)

    on_a = SummaryWriter("on-a", address=a)
    on_b = SummaryWriter("on-b", address=b)
    first = SummaryWriter("shared", address=a)
    writers = [on_a, on_b, first]
    try:
        first.add_scalar("first", 0.0, 0)
        first.flush(timeout=10)  # a holds the run's lease from here
        # A second worker of the run asks b, which refuses it naming a's advertised address, one of its own; it
        # follows.
        second = SummaryWriter("shared", address=f"{b},{a}", backoff_secs=(0.05, 0.2))
        writers.append(second)
        log_losses(on_a, range(100))
        log_losses(on_b, range(100))
        log_losses(second, range(100), "second")
        log_losses(first, range(1, 100), "first")
        for writer in writers:
            writer.flush(timeout=10)
        expected = {
            (run, tag): [(step, float(step)) for step in range(100)]
            for run, tag in (("on-a", "loss"), ("on-b", "loss"), ("shared", "first"), ("shared", "second"))
        }
        tensorboard = project.address("PORT_TENSORBOARD_BUCKET")

        def served() -> dict[tuple[str, str], list[tuple[int, float]]]:
            return {key: _scalars(tensorboard, *key) for key in expected}

        # Live, writers open: sealed by age (--seal-secs 5), listed by summaryd-a's board (every 2 s); the bound
        # only ends a failing run.
        wait_for(lambda: served() == expected, 120, "the bucket's TensorBoard to serve every scalar")
    finally:
        for writer in writers:
            writer.close(timeout=30)

    def staged_runs(service: str) -> set[str]:
        listing = _sh("podman", "exec", project.container(service), "ls", "/var/lib/summaryd/staging")
        return set(listing.stdout.split())

    assert staged_runs("summaryd-a") == {"on-a", "shared"}
    assert staged_runs("summaryd-b") == {"on-b"}  # b never wrote the shared run
