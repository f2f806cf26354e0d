"""The README's DDP example: a real `torch.distributed` job (gloo, two ranks on loopback) where every rank logs
through an unchanged torch script; each rank lands in `<run>/rank-N`, sub-runs too."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
from tensorboard.util.tensor_util import make_ndarray

from _support import Daemon, unused_port

TRAIN = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist
    from summaryd.client import SummaryWriter

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with SummaryWriter("ddp", aggregate=False) as writer:  # each rank's runs alone, no aggregates
        for step in range(20):
            inputs = torch.randn(8, 4)
            loss = ((model(inputs) - inputs.sum(dim=1, keepdim=True)) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            writer.add_scalar("rank", rank, step)
            writer.add_scalar("loss", loss, step)
            writer.add_scalars("lr", {"base": 0.1, "scaled": 0.1 * (rank + 1)}, step)
            if step % 10 == 0:
                writer.add_histogram("weight", model.module.weight, step)
        writer.add_hparams({"lr": 0.1}, {"hparam/final_loss": loss.item()}, run_name="hp")
    dist.destroy_process_group()
    """
)


def test_every_rank_of_a_ddp_job_logs_to_its_own_run(daemon: Daemon) -> None:
    port = unused_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TRAIN],
            env={
                **os.environ,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "SUMMARYD_ADDRESS": daemon.address,
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err

    multiplexer = EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(daemon.logdir))
    multiplexer.Reload()
    assert sorted(multiplexer.Runs()) == sorted(
        f"ddp/{sub}rank-{rank}" for rank in range(2) for sub in ("", "hp/", "lr_base/", "lr_scaled/")
    )
    for rank in range(2):
        run = f"ddp/rank-{rank}"
        assert [make_ndarray(t.tensor_proto).item() for t in multiplexer.Tensors(run, "rank")] == [rank] * 20
        assert [t.step for t in multiplexer.Tensors(run, "loss")] == list(range(20))
        assert [h.step for h in multiplexer.Tensors(run, "weight")] == [0, 10]
        scaled = multiplexer.Tensors(f"ddp/lr_scaled/rank-{rank}", "lr")
        values = {round(float(make_ndarray(t.tensor_proto)), 6) for t in scaled}
        assert values == {round(0.1 * (rank + 1), 6)}
        assert "_hparams_/session_start_info" in multiplexer.PluginRunToTagToContent("hparams")[f"ddp/hp/rank-{rank}"]
