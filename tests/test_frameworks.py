"""Real frameworks under `summaryd run`: what reaches the daemon equals what they write locally without it.

Each script runs twice, in two working directories: once as it is (torch's own writer, local event files),
once under `summaryd run`. The events are then compared one by one, wall time aside. Nothing is downloaded:
the Transformers model is built from a config and `HF_HUB_OFFLINE=1` holds.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from _support import Daemon, event_files, read_events
from benchmarks.framework_cost import CASES, SUMMARYD_CASES, rows

pytestmark = [pytest.mark.frameworks, pytest.mark.no_findings]

LIGHTNING = textwrap.dedent(
    """
    import os
    import torch
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.save_hyperparameters({"lr": 0.1, "hidden": 4})
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, index):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, index):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    if __name__ == "__main__":  # Lightning's DDP launcher runs this script again for rank 1
        L.seed_everything(0)
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        ddp = dict(devices=2, strategy="ddp") if os.environ.get("TINY_DDP") else dict(devices=1, deterministic=True)
        trainer = L.Trainer(
            max_epochs=3, log_every_n_steps=1, accelerator="cpu", enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, **ddp,
        )
        trainer.fit(Tiny(), DataLoader(data, batch_size=16), DataLoader(data, batch_size=32))
    """
)

TRANSFORMERS = textwrap.dedent(
    """
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    class Batches(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return {"input_ids": torch.randint(0, 50, (8,), generator=g), "labels": torch.tensor(i % 2)}

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=2,
    )
    args = TrainingArguments(
        output_dir="output", report_to="tensorboard", logging_steps=1, num_train_epochs=2,
        per_device_train_batch_size=8, use_cpu=True, seed=0, save_strategy="no", disable_tqdm=True,
    )
    Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Batches()).train()
    """
)

TORCHRUN = textwrap.dedent(
    """
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    writer = SummaryWriter("runs/ddp")
    for step in range(5):
        writer.add_scalar("loss", rank * 10 + step, step)
    dist.barrier()
    writer.close()
    dist.destroy_process_group()
    """
)

# Values that measure the run's own speed differ between any two runs, with or without summaryd.
TIMINGS = {"train/train_runtime", "train/train_samples_per_second", "train/train_steps_per_second"}


def _environment() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONHASHSEED": "0"}


def run_script(script: str, work: Path, *prefix: str, env: dict[str, str] | None = None) -> str:
    work.mkdir(parents=True, exist_ok=True)
    (work / "train.py").write_text(script)
    done = subprocess.run(
        [*prefix, sys.executable, "train.py"],
        cwd=work,
        env={**_environment(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stderr


def under_summaryd(daemon: Daemon, root: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "summaryd.server", "run", "--address", daemon.address, "--run-root", root, "--")


def comparable(run_dir: Path) -> list[Event]:
    """The events of a run directory's event files, in order, without `file_version` and wall times."""
    events = []
    for path in event_files(run_dir):
        for event in read_events(path):
            if event.WhichOneof("what") == "file_version":
                continue
            event.wall_time = 0
            if event.HasField("summary") and any(v.tag in TIMINGS for v in event.summary.value):
                continue
            for value in event.summary.value:
                # torch builds the hparams plugin's data with protobuf maps, whose serialized order differs from
                # process to process (also between two runs without summaryd): compare them in a fixed order.
                if value.metadata.plugin_data.plugin_name == "hparams":
                    content = HParamsPluginData.FromString(value.metadata.plugin_data.content)
                    value.metadata.plugin_data.content = content.SerializeToString(deterministic=True)
            events.append(event)
    return events


def only(pattern: str) -> Path:
    found = glob.glob(pattern)
    assert len(found) == 1, (pattern, found)
    return Path(found[0])


def test_lightning_tensorboard_logger_logs_through_summaryd(daemon: Daemon, tmp_path: Path) -> None:
    run_script(LIGHTNING, tmp_path / "local")
    err = run_script(LIGHTNING, tmp_path / "zero", *under_summaryd(daemon, "lightning"))
    assert "summaryd run: " in err and ", 0 undelivered, dropped none" in err
    local = comparable(tmp_path / "local" / "lightning_logs" / "version_0")
    remote = comparable(daemon.logdir / "lightning" / "lightning_logs" / "version_0")
    tags = {v.tag for e in local for v in e.summary.value}
    assert {"train_loss", "val_loss", "epoch", "hp_metric"} <= tags
    assert remote == local
    # Lightning's own files beside the events still go to the local directory it chose.
    assert (tmp_path / "zero" / "lightning_logs" / "version_0" / "hparams.yaml").is_file()


def test_transformers_trainer_logs_through_summaryd(daemon: Daemon, tmp_path: Path) -> None:
    run_script(TRANSFORMERS, tmp_path / "local")
    err = run_script(TRANSFORMERS, tmp_path / "zero", *under_summaryd(daemon, "hf"))
    assert ", 0 undelivered, dropped none" in err
    local_dir = only(str(tmp_path / "local" / "output" / "runs" / "*"))
    remote_dir = only(str(daemon.logdir / "hf" / "output" / "runs" / "*"))
    local, remote = comparable(local_dir), comparable(remote_dir)
    tags = {v.tag for e in local for v in e.summary.value}
    assert {"train/loss", "train/learning_rate", "args/text_summary"} <= tags
    assert remote == local


def test_torchrun_ranks_land_in_their_worker_directories(daemon: Daemon, tmp_path: Path) -> None:
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
    command = [*under_summaryd(daemon, "ddp"), *torchrun, "train.py"]
    work = tmp_path / "zero"
    work.mkdir()
    (work / "train.py").write_text(TORCHRUN)
    done = subprocess.run(
        command, cwd=work, env=_environment(), capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-5000:]
    assert "2 writers delivered 10 events" in done.stderr
    for rank in (0, 1):
        run_dir = daemon.logdir / "ddp" / "ddp" / f"rank-{rank}"
        values = [
            (e.step, v.simple_value) for p in event_files(run_dir) for e in read_events(p) for v in e.summary.value
        ]
        assert values == [(step, rank * 10 + step) for step in range(5)]


def test_lightning_ddp_rank_zero_lands_in_its_worker_directory(daemon: Daemon, tmp_path: Path) -> None:
    """Lightning's own DDP launcher (gloo on CPU) sets no `RANK`; the rank comes from the process group. Only
    rank zero logs in Lightning, so one writer, in `<run>/rank-0`."""
    err = run_script(LIGHTNING, tmp_path / "zero", *under_summaryd(daemon, "ddp"), env={"TINY_DDP": "1"})
    assert "summaryd run: 1 writer delivered" in err and ", 0 undelivered" in err
    version = daemon.logdir / "ddp" / "lightning_logs" / "version_0"
    assert sorted(p.name for p in version.iterdir()) == ["rank-0"]
    steps = [e.step for p in event_files(version / "rank-0") for e in read_events(p) if e.HasField("summary")]
    assert len(steps) >= 4


def test_framework_cost_benchmark_runs_every_case(capsys: pytest.CaptureFixture[str]) -> None:
    """`benchmarks/framework_cost.py` at a tiny size: a row per framework and case, and a verdict on the 1.1
    times torch's target for each summaryd case (the figures live in benchmarks/RESULTS.md)."""
    lines = rows(rounds=2, steps=4)
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    frameworks = ("lightning", "transformers")
    table = [line.split()[:2] for line in lines if line.startswith(frameworks)]
    assert table == [[framework, case.split()[0]] for framework in frameworks for case in CASES]
    verdicts = [line.split(":")[0] for line in lines if line.startswith("target ")]
    assert verdicts == [f"target {framework} {case}" for framework in frameworks for case in SUMMARYD_CASES]
    assert all(line.endswith((": met", ": NOT met")) for line in lines if line.startswith("target "))
    assert lines[-1].startswith("load average: ")
