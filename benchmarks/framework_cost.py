"""What summaryd costs a framework's training loop: Lightning `fit()` and Transformers `Trainer.train()` on tiny
models, logging (and so flushing) every step, timed with torch's own writer and under `patch()` with the
daemon up, slow (its process SIGSTOPped) and absent.

One process per framework runs every case in turn, `rounds` times interleaved after a warm-up fit, so that
imports and first-call costs are paid once for all; each row is the median of its case, and the ratio is
against torch's. Run it: `python -m benchmarks.framework_cost [rounds]` (about a minute per round on two
cores). The target is at most 1.1 times torch's in every case.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from _daemon import Daemon
from benchmarks._run import refused_address, running_daemon

CASES = ("torch", "daemon up", "daemon slow", "daemon absent")

_TRAIN = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import torch

    def lightning(root):
        import lightning as L
        from torch.utils.data import DataLoader, TensorDataset

        class Linear(L.LightningModule):  # the smallest model: what the logger costs shows most
            def __init__(self):
                super().__init__()
                self.save_hyperparameters({"lr": 0.05})  # add_hparams at fit start
                self.fc = torch.nn.Linear(4, 1)
                self.example_input_array = torch.zeros(1, 4)  # log_graph: add_graph at fit start

            def forward(self, x):
                return self.fc(x)

            def training_step(self, batch, index):
                loss = (self.fc(batch[0]) - batch[1]).pow(2).mean()
                self.log("loss", loss)  # every step (log_every_n_steps=1), then logger.save(): flush()
                return loss

            def configure_optimizers(self):
                return torch.optim.SGD(self.fc.parameters(), lr=self.hparams.lr)

        L.seed_everything(0, verbose=False)
        data = TensorDataset(torch.randn(STEPS, 4), torch.randn(STEPS, 1))
        trainer = L.Trainer(
            max_epochs=1, log_every_n_steps=1, accelerator="cpu", enable_checkpointing=False, default_root_dir=root,
            enable_progress_bar=False, enable_model_summary=False,
            logger=L.pytorch.loggers.TensorBoardLogger(root, log_graph=True),
        )
        started = time.perf_counter()
        trainer.fit(Linear(), DataLoader(data, batch_size=1))
        return time.perf_counter() - started

    def transformers(root):
        from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()

        torch.manual_seed(0)
        batches = [{"input_ids": torch.randint(0, 50, (8,)), "labels": torch.tensor(i % 2)} for i in range(STEPS)]
        tiny = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
        config = BertConfig(vocab_size=50, max_position_embeddings=16, num_labels=2, **tiny)
        args = TrainingArguments(
            output_dir=root, report_to="tensorboard", logging_steps=1, num_train_epochs=1,
            per_device_train_batch_size=1, use_cpu=True, seed=0, save_strategy="no", disable_tqdm=True,
        )
        trainer = Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=batches)
        started = time.perf_counter()
        trainer.train()
        return time.perf_counter() - started

    framework, rounds, STEPS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    up, slow, slow_pid, absent = sys.argv[4:8]
    train = lightning if framework == "lightning" else transformers
    train("warm-up")  # imports and first calls, once for every case
    import torch.utils.tensorboard as tb
    import torch.utils.tensorboard.writer as tb_writer
    import summaryd.client

    # What patch() replaces, and torch's writer reaches (its SummaryWriter makes a FileWriter of its module's).
    torch_classes = {(m, n): getattr(m, n) for m in (tb, tb_writer) for n in ("SummaryWriter", "FileWriter")}
    times = {}
    for round_ in range(rounds):
        for case, address in (("torch", None), ("daemon up", up), ("daemon slow", slow), ("daemon absent", absent)):
            if address is None:
                for (module, name), cls in torch_classes.items():
                    setattr(module, name, cls)
            else:
                summaryd.client.patch()  # summaryd's writer in its place, at SUMMARYD_ADDRESS
                os.environ["SUMMARYD_ADDRESS"] = address
            if case == "daemon slow":
                os.kill(int(slow_pid), signal.SIGSTOP)
            try:
                times.setdefault(case, []).append(train(f"{case.replace(' ', '-')}-{round_}"))
            finally:
                if case == "daemon slow":
                    os.kill(int(slow_pid), signal.SIGCONT)
    print(json.dumps(times), flush=True)
    os._exit(0)  # the exit's wait for the slow and absent daemons is not the loop's cost
    """
)


def measure(framework: str, rounds: int, steps: int, workdir: Path, up: Daemon, slow: Daemon) -> dict[str, float]:
    """Median seconds of `framework`'s training call in each case."""
    script = workdir / "train.py"
    script.write_text(_TRAIN)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    env["SUMMARYD_SPOOL_DIR"] = str(workdir / "spool")  # what the slow and absent cases spool, removed after
    with refused_address() as absent:
        argv = [sys.executable, str(script), framework, str(rounds), str(steps), up.address, slow.address]
        argv += [str(slow.pid), absent]
        done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    times: dict[str, list[float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return {case: statistics.median(times[case]) for case in CASES}


def rows(rounds: int = 3, steps: int = 64) -> list[str]:
    """One line per framework and case: median seconds of the training call, and the ratio to torch's."""
    lines = [f"{'framework':<13}{'case':<15}{'seconds':>9}{'ratio':>8}   ({steps} steps, logged every step)"]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "up").mkdir()
        (workdir / "slow").mkdir()
        with running_daemon(workdir / "up") as up, running_daemon(workdir / "slow") as slow:
            try:
                for framework in ("lightning", "transformers"):
                    medians = measure(framework, rounds, steps, workdir, up, slow)
                    for case in CASES:
                        ratio = medians[case] / medians["torch"]
                        lines.append(f"{framework:<13}{case:<15}{medians[case]:>9.3f}{ratio:>7.2f}x")
            finally:
                os.kill(slow.pid, signal.SIGCONT)
    return lines


if __name__ == "__main__":
    for line in rows(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        print(line, flush=True)
