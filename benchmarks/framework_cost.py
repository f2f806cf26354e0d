"""What summaryd costs a framework's training loop: Lightning `fit()` and Transformers `Trainer.train()` on tiny
models, logging (and so flushing) every step, timed with torch's own writer and under `patch()` with the
daemon up, slow (its process SIGSTOPped) and absent.

One process per framework runs every case in turn, `rounds` times interleaved after a warm-up fit, so that
imports and first-call costs are paid once for all; each round takes the cases in another order (what runs
after a SIGCONTed daemon catching up, or first after the warm-up, is not always the same case), with a full
garbage collection before each call. A case's ratio is the median over rounds of its time over torch's in the
same round (drift of the shared machine between rounds cancels out), shown with the lowest and highest of
those ratios. Run it: `python -m benchmarks.framework_cost [rounds] [steps]` (default 7 rounds of 256 steps:
about ten minutes on two cores). The target is at most 1.1 times torch's in every case.
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
TARGET = 1.1
"""At most this many times torch's wall time, in every case."""

_TRAIN = textwrap.dedent(
    """
    import gc, json, os, signal, sys, time
    import torch

    # One thread of torch's own: on a shared machine its idle workers' spinning swamps what a tiny model's step
    # costs, and with it the logger's share that is measured here.
    torch.set_num_threads(1)

    def timed(call):  # wall and CPU seconds (every thread of this process: summaryd's sender and gRPC's too)
        wall, cpu = time.perf_counter(), time.process_time()
        call()
        return time.perf_counter() - wall, time.process_time() - cpu

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
        model, loader = Linear(), DataLoader(data, batch_size=1)
        return timed(lambda: trainer.fit(model, loader))

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
        return timed(trainer.train)

    framework, rounds, STEPS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    up, slow, slow_pid, absent = sys.argv[4:8]
    train = lightning if framework == "lightning" else transformers
    train("warm-up")  # imports and first calls, once for every case
    import torch.utils.tensorboard as tb
    import torch.utils.tensorboard.writer as tb_writer
    import summaryd.client

    # What patch() replaces, and torch's writer reaches (its SummaryWriter makes a FileWriter of its module's).
    torch_classes = {(m, n): getattr(m, n) for m in (tb, tb_writer) for n in ("SummaryWriter", "FileWriter")}
    cases = [("torch", None), ("daemon up", up), ("daemon slow", slow), ("daemon absent", absent)]
    times, cpu = {}, {}
    for round_ in range(rounds):
        for case, address in cases[round_ % 4 :] + cases[: round_ % 4]:
            if address is None:
                for (module, name), cls in torch_classes.items():
                    setattr(module, name, cls)
            else:
                summaryd.client.patch()  # summaryd's writer in its place, at SUMMARYD_ADDRESS
                os.environ["SUMMARYD_ADDRESS"] = address
            gc.collect()
            if case == "daemon slow":
                os.kill(int(slow_pid), signal.SIGSTOP)
            try:
                wall, seconds = train(f"{case.replace(' ', '-')}-{round_}")
                times.setdefault(case, []).append(wall)
                cpu.setdefault(case, []).append(seconds)
            finally:
                if case == "daemon slow":
                    os.kill(int(slow_pid), signal.SIGCONT)
    print(json.dumps({"wall": times, "cpu": cpu}), flush=True)
    os._exit(0)  # the exit's wait for the slow and absent daemons is not the loop's cost
    """
)


Rounds = dict[str, list[float]]
"""Seconds of each case's training call, round by round."""


def measure(framework: str, rounds: int, steps: int, workdir: Path, up: Daemon, slow: Daemon) -> tuple[Rounds, Rounds]:
    """Wall and CPU seconds of `framework`'s training call in each case, round by round."""
    script = workdir / "train.py"
    script.write_text(_TRAIN)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    env["SUMMARYD_SPOOL_DIR"] = str(workdir / "spool")  # what the slow and absent cases spool, removed after
    with refused_address() as absent:
        argv = [sys.executable, str(script), framework, str(rounds), str(steps), up.address, slow.address]
        argv += [str(slow.pid), absent]
        done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    measured: dict[str, Rounds] = json.loads(done.stdout.strip().splitlines()[-1])
    return measured["wall"], measured["cpu"]


def ratios(seconds: Rounds, case: str) -> list[float]:
    """`case`'s seconds over torch's, round by round."""
    return [mine / torch for mine, torch in zip(seconds[case], seconds["torch"], strict=True)]


def _spread(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def rows(rounds: int = 7, steps: int = 256) -> list[str]:
    """One line per framework and case: the wall seconds of the training call (median, and range over rounds),
    the wall ratio to torch's, the ratio of the fastest rounds' (noise from other processes only adds time) and
    the ratio of CPU seconds; then whether each case meets the target, and the machine's load."""
    lines = [
        f"{rounds} rounds of {steps} steps, logged (and flushed) every step; ratios to torch's in the same round,",
        "median (min-max) over rounds; best: fastest round over torch's fastest; cpu: every thread of the process",
        f"{'framework':<13}{'case':<15}{'wall s':<22}{'wall ratio':<19}{'best':<7}{'cpu ratio':<18}",
    ]
    verdicts = []
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "up").mkdir()
        (workdir / "slow").mkdir()
        with running_daemon(workdir / "up") as up, running_daemon(workdir / "slow") as slow:
            try:
                for framework in ("lightning", "transformers"):
                    wall, cpu = measure(framework, rounds, steps, workdir, up, slow)
                    for case in CASES:
                        ratio = ratios(wall, case)
                        best = min(wall[case]) / min(wall["torch"])
                        lines.append(
                            f"{framework:<13}{case:<15}{_spread(wall[case], 3):<22}{_spread(ratio, 2):<19}"
                            f"{best:<7.2f}{_spread(ratios(cpu, case), 2):<18}".rstrip()
                        )
                        if case != "torch":
                            median = statistics.median(ratio)
                            met = "met" if median <= TARGET else "NOT met"
                            verdicts.append(
                                f"target {framework} {case}: wall {median:.2f}x of torch's (best {best:.2f}x)"
                                f" <= {TARGET}x: {met}"
                            )
            finally:
                os.kill(slow.pid, signal.SIGCONT)
    verdicts.append(
        f"load average: {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} cores)"
    )
    return lines + verdicts


if __name__ == "__main__":
    arguments = [int(a) for a in sys.argv[1:3]]
    for line in rows(*arguments):
        print(line, flush=True)
