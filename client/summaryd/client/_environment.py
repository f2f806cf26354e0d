"""What the client reads from its environment: the daemon's address and this process's worker label."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_ADDRESS = "localhost:6065"


def resolve_address(address: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """The argument, else `SUMMARYD_ADDRESS`, else `localhost:6065`."""
    return address or environ.get("SUMMARYD_ADDRESS") or DEFAULT_ADDRESS


@dataclass(frozen=True)
class Worker:
    """This process's place in a job: the label of its run sub-directory and the world size."""

    label: str
    world_size: int


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def detect_worker(environ: Mapping[str, str] = os.environ) -> Worker:
    """Find the worker label from the launcher's environment.

    torch.distributed (`RANK`/`WORLD_SIZE`), TensorFlow (`TF_CONFIG`), Open MPI (`OMPI_COMM_WORLD_*`) and Slurm
    (`SLURM_PROCID`/`SLURM_NTASKS`) are understood. The label is empty when the world has one process, so a
    single process writes to the run directory itself.
    """
    tf_config = environ.get("TF_CONFIG")
    if tf_config:
        try:
            config = json.loads(tf_config)
            task = config.get("task", {})
            cluster = config.get("cluster", {})
            world = sum(len(v) if isinstance(v, list | dict) else 1 for v in cluster.values())
            if world > 1 and "type" in task:
                return Worker(f"{task['type']}-{int(task.get('index', 0))}", world)
        except (ValueError, TypeError, AttributeError):
            pass
    for rank_var, size_var in (
        ("RANK", "WORLD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ):
        rank, size = _int(environ, rank_var), _int(environ, size_var)
        if rank is not None and size is not None and size > 1:
            return Worker(f"rank-{rank}", size)
    return Worker("", 1)
