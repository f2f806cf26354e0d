"""The daemon watches the training (issue 28): real client processes (`_watch_worker.py`, summaryd's writer) and a
real daemon; each rule fires once naming run, rank and step, resolves when its condition ends, and says nothing
about a steady run. Findings are read where users read them: the webhook (a loopback HTTP server taking
Alertmanager's format), `/metrics` on `--metrics-listen`, `summaryd status --json` and `summaryd watch`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _webhook_receiver import Receiver
from prometheus_client.parser import text_string_to_metric_families

from _support import Daemon, TensorBoard, start_daemon, unused_port, wait_for
from benchmarks.watch_alerts import steady
from summaryd.cli import main
from summaryd.client import SummaryWriter

WORKER = Path(__file__).with_name("_watch_worker.py")
STEP_SECS = 0.02


class Hook(Receiver):
    """The webhook receiver of a test's daemon: its messages, parsed."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [json.loads(body) for body in list(self.bodies)]

    def alerts(self, rule: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
        return [
            alert
            for message in self.messages
            for alert in message["alerts"]
            if (rule is None or alert["labels"]["rule"] == rule) and (status is None or alert["status"] == status)
        ]


@pytest.fixture
def hook() -> Iterator[Hook]:
    receiver = Hook()
    try:
        yield receiver
    finally:
        receiver.close()


class Job:
    """`world` worker processes of run `run`, each `_watch_worker.py` with the spec given (plus its rank)."""

    def __init__(self, tmp_path: Path, daemon: Daemon, run: str, world: int, **specs: dict[str, Any]) -> None:
        self.until = tmp_path / f"{run.replace('/', '-')}.until"
        self.seed = int(os.environ.get("WATCH_SEED", time.time_ns() % 10_000))
        print(f"watch job {run}: seed {self.seed}")
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank in range(world):
            spec = {
                "address": daemon.address,
                "run": run,
                "rank": rank,
                "world": world,
                "step_secs": STEP_SECS,
                "seed": self.seed,
                "until": str(self.until),
                **specs.get(f"rank{rank}", {}),
            }
            self.procs.append(subprocess.Popen([sys.executable, str(WORKER), json.dumps(spec)]))

    def marked(self, worker: str, step: int) -> bool:
        return Path(f"{self.until}.{worker}.at-{step}").exists()

    def stop(self) -> None:
        self.until.touch()
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)  # a stopped one must go on to close
            assert proc.wait(60) == 0

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)


def _daemon(tmp_path: Path, hook: Hook, rules: str = "", *flags: str, logdir: Path | None = None) -> Daemon:
    rules_file = tmp_path / "rules.toml"
    rules_file.write_text(rules)
    return start_daemon(
        tmp_path,
        "--metrics-listen",
        "127.0.0.1:0",
        "--watch-webhook",
        hook.url,
        "--watch-rules",
        str(rules_file),
        *flags,
        logdir=logdir,
    )


@contextlib.contextmanager
def _watched(
    tmp_path: Path,
    hook: Hook,
    run: str,
    world: int,
    rules: str = "",
    flags: tuple[str, ...] = (),
    **specs: dict[str, Any],
) -> Iterator[tuple[Daemon, Job]]:
    """A daemon watching with `rules` (and `flags`), and a job of `world` workers on it; the job closes at the end
    of the block (killed, with the daemon stopped, whatever happens)."""
    daemon = _daemon(tmp_path, hook, rules, *flags)
    job = Job(tmp_path, daemon, run, world, **specs)
    try:
        yield daemon, job
        job.stop()
    finally:
        job.kill()
        daemon.stop()


def _fired_once_resolved_once(hook: Hook) -> None:
    assert [a["status"] for a in hook.alerts()] == ["firing", "resolved"], hook.messages


def _metrics(daemon: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    wait_for(lambda: "metrics on http" in daemon.log(), 10, "the metrics address")
    port = daemon.log().split("metrics on http://127.0.0.1:")[1].split("/")[0]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _status(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["status", "--address", daemon.address, "--json"]) == 0
    status: dict[str, Any] = json.loads(capsys.readouterr().out)
    return status


@pytest.mark.parametrize("summary", [False, True], ids=["add_scalar", "add_summary"])
def test_a_nan_fires_once_naming_run_rank_and_step_and_resolves_when_finite_again(
    tmp_path: Path, hook: Hook, capsys: pytest.CaptureFixture[str], summary: bool
) -> None:
    """Rank 1 of 2 logs NaN from step 40 on (as scalar columns, or as serialized summaries): one finding, in the
    webhook (Alertmanager's format), the metrics, `summaryd status` and `summaryd watch --json`; once it logs
    finite values again, one resolution; nothing else is found."""
    heal = tmp_path / "heal"
    spec = {"nan": 40, "heal": str(heal), "summary": summary}
    with _watched(tmp_path, hook, "nan-job", 2, rank0={"summary": summary}, rank1=spec) as (daemon, _):
        wait_for(lambda: hook.alerts("nonfinite"), 30, "the non-finite finding")
        [message] = hook.messages
        assert message["version"] == "4" and message["status"] == "firing" and message["receiver"] == "summaryd"
        assert message["truncatedAlerts"] == 0 and "groupKey" in message and message["groupLabels"]["run"] == "nan-job"
        [alert] = message["alerts"]
        assert alert["labels"] == {
            "alertname": "summaryd_nonfinite",
            "rule": "nonfinite",
            "run": "nan-job",
            "rank": "rank-1",
            "tag": "loss",
        }
        assert alert["annotations"]["step"] == "40" and alert["annotations"]["value"] == "nan"
        assert alert["endsAt"] == "0001-01-01T00:00:00Z" and alert["startsAt"].endswith("Z") and alert["fingerprint"]
        metrics = _metrics(daemon)
        assert metrics[("summaryd_watch_firing", (("rule", "nonfinite"), ("run", "nan-job")))] == 1
        assert metrics[("summaryd_watch_fired_total", (("rule", "nonfinite"),))] == 1
        [finding] = _status(daemon, capsys)["findings"]
        assert (finding["rule"], finding["run"], finding["rank"], finding["step"]) == (
            "nonfinite",
            "nan-job",
            "rank-1",
            40,
        )
        assert finding["state"] == "firing" and "rank-1" in finding["summary"]
        assert main(["watch", "--address", daemon.address, "--once", "--json"]) == 0
        [line] = capsys.readouterr().out.splitlines()
        assert json.loads(line) == finding
        heal.touch()
        wait_for(lambda: hook.alerts("nonfinite", "resolved"), 30, "the resolution")
        [resolved] = hook.alerts("nonfinite", "resolved")
        assert resolved["labels"] == alert["labels"] and resolved["endsAt"] != "0001-01-01T00:00:00Z"
        assert ("summaryd_watch_firing", (("rule", "nonfinite"), ("run", "nan-job"))) not in _metrics(daemon)
        assert _status(daemon, capsys)["findings"] == []
    _fired_once_resolved_once(hook)


def test_a_diverging_loss_fires_once_on_its_rank_and_resolves(tmp_path: Path, hook: Hook) -> None:
    """Rank 0's loss grows 1.5x a step from step 60: one divergence finding naming rank 0 and a step just past 60;
    once the loss is back to its level, one resolution; nothing else is found."""
    heal = tmp_path / "heal"
    with _watched(tmp_path, hook, "div-job", 2, rank0={"diverge": 60, "heal": str(heal)}):
        wait_for(lambda: hook.alerts("divergence"), 30, "the divergence finding")
        [alert] = hook.alerts("divergence")
        assert alert["labels"]["rank"] == "rank-0" and alert["labels"]["tag"] == "loss"
        assert 60 <= int(alert["annotations"]["step"]) <= 66, alert
        heal.touch()
        wait_for(lambda: hook.alerts("divergence", "resolved"), 30, "the resolution")
    _fired_once_resolved_once(hook)


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Children started within take Ctrl-C as from a terminal, even where this test runs as a background job
    (whose children inherit SIGINT ignored, which Python then leaves ignored)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize(
    ("session", "flags", "after"),
    [
        ("open", (), ""),
        (
            "lost (released by the daemon)",
            ("--session-lease", "1", "--stream-idle-timeout", "0.5", "--silent-after", "4"),
            "(silent after 4.0s)",
        ),
    ],
    ids=["its session open", "its session lost, --silent-after"],
)
def test_a_stopped_rank_is_silent_until_it_goes_on(
    tmp_path: Path, hook: Hook, session: str, flags: tuple[str, ...], after: str
) -> None:
    """Rank 1 of 2 is SIGSTOPped: one silence finding naming it, at its last step, within its cadence's bound
    (or `--silent-after`'s), while its session is open or after the daemon released it; on SIGCONT, one
    resolution. `summaryd watch` follows both as lines."""
    with _watched(tmp_path, hook, "hang-job", 2, "", flags, rank1={"mark": [50]}) as (daemon, job):
        followed = tmp_path / "followed.txt"
        with followed.open("w") as into, _interruptible():
            follower = subprocess.Popen(
                [sys.executable, "-m", "summaryd.server", "watch", "--address", daemon.address, "--interval", "0.1"],
                stdout=into,
            )
        try:
            wait_for(lambda: job.marked("rank-1", 50), 30, "rank 1 at step 50")
            os.kill(job.procs[1].pid, signal.SIGSTOP)
            stopped = time.monotonic()
            wait_for(lambda: hook.alerts("silence"), 30, "the silence finding")
            print(f"silence found {time.monotonic() - stopped:.1f}s after SIGSTOP")
            [alert] = hook.alerts("silence")
            assert alert["labels"]["rank"] == "rank-1" and alert["labels"]["run"] == "hang-job"
            assert int(alert["annotations"]["step"]) >= 50
            assert f"its session is {session}" in alert["annotations"]["summary"]
            assert after in alert["annotations"]["summary"], alert
            os.kill(job.procs[1].pid, signal.SIGCONT)
            wait_for(lambda: hook.alerts("silence", "resolved"), 30, "the resolution")
            wait_for(lambda: " resolved silence " in followed.read_text(), 30, "summaryd watch to follow it")
            follower.send_signal(signal.SIGINT)
            assert follower.wait(30) == 0
            out = followed.read_text()
        finally:
            follower.kill()
    _fired_once_resolved_once(hook)
    lines = [line for line in out.splitlines() if " silence " in line]
    assert [line.split()[1] for line in lines] == ["firing", "resolved"], out
    assert "run=hang-job rank=rank-1" in lines[0]


def test_a_job_whose_every_rank_stops_at_once_is_silent_as_a_whole(tmp_path: Path, hook: Hook) -> None:
    """Every rank of 3 is SIGSTOPped at once (a hang in a collective: the run goes quiet as a whole, its streams
    open and idle): one silence finding of the run, naming a rank at its last step and every worker silent, its
    session open; once they go on (SIGCONT by pid), one resolution. How soon: `benchmarks/watch_alerts.py`."""
    marks = {f"rank{rank}": {"mark": [50]} for rank in range(3)}
    with _watched(tmp_path, hook, "hung-job", 3, **marks) as (_, job):
        wait_for(lambda: all(job.marked(f"rank-{rank}", 50) for rank in range(3)), 30, "every rank at step 50")
        for proc in job.procs:
            os.kill(proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        wait_for(lambda: hook.alerts("silence"), 30, "the silence finding")
        print(f"silence found {time.monotonic() - stopped:.1f}s after SIGSTOP")
        [alert] = hook.alerts("silence")
        assert alert["labels"]["run"] == "hung-job" and alert["labels"]["rank"].startswith("rank-")
        assert int(alert["annotations"]["step"]) >= 50
        summary = alert["annotations"]["summary"]
        assert "3 of 3 workers silent" in summary and "its session is open" in summary, summary
        for proc in job.procs:
            os.kill(proc.pid, signal.SIGCONT)
        wait_for(lambda: hook.alerts("silence", "resolved"), 30, "the resolution")
    _fired_once_resolved_once(hook)


def test_a_slower_rank_is_named_a_straggler_until_it_keeps_pace(tmp_path: Path, hook: Hook) -> None:
    """Rank 2 of 3 takes 4x as long a step while a file exists: one straggler finding naming it; once it keeps
    pace again, one resolution."""
    slow = tmp_path / "slow"
    slow.touch()
    rules = "[straggler]\nfor_secs = 1.0\n"
    with _watched(tmp_path, hook, "slow-job", 3, rules, rank2={"slow": str(slow), "slow_secs": 3 * STEP_SECS}):
        wait_for(lambda: hook.alerts("straggler"), 30, "the straggler finding")
        [alert] = hook.alerts("straggler")
        assert alert["labels"]["rank"] == "rank-2" and alert["labels"]["run"] == "slow-job"
        assert float(alert["annotations"]["value"]) >= 1.5
        slow.unlink()
        wait_for(lambda: hook.alerts("straggler", "resolved"), 30, "the resolution")
    _fired_once_resolved_once(hook)


def test_a_steady_job_gives_no_finding_and_the_watch_holds_its_bounds(
    tmp_path: Path, hook: Hook, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three ranks log a noisy, falling loss for a few seconds and close: nothing fires anywhere. With room for two
    divergence series, the third rank's loss is counted unwatched; once the job closed, the watch holds nothing."""
    with _watched(tmp_path, hook, "steady", 3, "max_series = 2\n", rank0={"mark": [150]}) as (daemon, job):
        wait_for(lambda: job.marked("rank-0", 150), 60, "rank 0 at step 150")
        assert _status(daemon, capsys)["watching"] is True
        metrics = _metrics(daemon)
        assert metrics[("summaryd_watch_runs", ())] == 1 and metrics[("summaryd_watch_series", ())] == 2
        assert metrics[("summaryd_watch_points_unwatched_total", ())] > 0
        job.stop()
        time.sleep(1.0)  # what a tick after the close could find
        assert _status(daemon, capsys)["findings"] == []
        metrics = _metrics(daemon)
        assert not any(name == "summaryd_watch_fired_total" for name, _ in metrics)
        assert metrics[("summaryd_watch_runs", ())] == 0 and metrics[("summaryd_watch_series", ())] == 0
    assert hook.messages == []


def test_a_restart_mid_finding_does_not_fire_it_again(tmp_path: Path, hook: Hook) -> None:
    """A NaN finding fires, the daemon is stopped and started again on the same logdir and port while the NaNs go
    on: the finding is taken up as firing (not sent again) and resolves once, after the restart."""
    port = unused_port()
    daemon = _daemon(tmp_path, hook, "", "--listen", f"127.0.0.1:{port}")
    heal = tmp_path / "heal"
    job = Job(tmp_path, daemon, "restart-job", 2, rank0={"nan": 30, "heal": str(heal)})
    try:
        wait_for(lambda: hook.alerts("nonfinite"), 30, "the non-finite finding")
        assert daemon.stop() == 0
        daemon = _daemon(tmp_path, hook, "", "--listen", f"127.0.0.1:{port}", logdir=daemon.logdir)
        assert "taken up (not fired again)" in daemon.log()
        time.sleep(2.0)  # the NaNs go on after the clients resumed
        assert len(hook.alerts("nonfinite", "firing")) == 1
        heal.touch()
        wait_for(lambda: hook.alerts("nonfinite", "resolved"), 30, "the resolution")
        job.stop()
    finally:
        job.kill()
        daemon.stop()
    assert [a["status"] for a in hook.alerts()] == ["firing", "resolved"], hook.messages


@pytest.mark.slow
def test_tensorboard_shows_the_watch_scalars_beside_the_curves(tmp_path: Path, hook: Hook) -> None:
    """After a NaN finding fired and resolved, a real TensorBoard on the logdir serves `<run>/summaryd`'s
    `watch/nonfinite` scalars (1 then 0) and the text naming rank and step, beside the workers' `loss`."""
    heal = tmp_path / "heal"
    with _watched(tmp_path, hook, "board-job", 2, rank1={"nan": 40, "heal": str(heal)}) as (daemon, _):
        wait_for(lambda: hook.alerts("nonfinite"), 30, "the non-finite finding")
        heal.touch()
        wait_for(lambda: hook.alerts("nonfinite", "resolved"), 30, "the resolution")
    board = TensorBoard(["--logdir", str(daemon.logdir), "--reload_interval", "1"], tmp_path)
    try:

        def runs() -> dict[str, Any]:
            found: dict[str, Any] = board.get("/data/plugin/scalars/tags")
            return found

        wait_for(lambda: "watch/nonfinite" in runs().get("board-job/summaryd", {}), 60, "the watch scalars")
        assert "loss" in runs()["board-job/rank-1"]
        points = board.get("/data/plugin/scalars/scalars", run="board-job/summaryd", tag="watch/nonfinite")
        assert [p[2] for p in points] == [1.0, 0.0] and points[0][1] == 40 < points[1][1], points
        texts = board.get("/data/plugin/text/text", run="board-job/summaryd", tag="watch/nonfinite/finding")
        assert "rank-1" in texts[0]["text"] and "step 40" in texts[0]["text"]
    finally:
        os.kill(board.proc.pid, signal.SIGTERM)
        board.proc.wait(30)


def test_a_single_writer_is_watched_and_status_shows_a_token_the_findings_of_its_runs_only(
    tmp_path: Path, hook: Hook, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of one writer (no worker label) logs NaN: its finding names no rank; `summaryd status` shows it to
    the token of the run's prefix and not to another tenant's; it resolves when the run's session closes."""
    mine, theirs = "a" * 48, "b" * 48
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{mine} team-a/\n{theirs} team-b/\n")
    monkeypatch.setenv("SUMMARYD_TOKEN", mine)  # the writer processes' token
    with _watched(tmp_path, hook, "team-a/job", 1, "", ("--token-file", str(tokens)), rank0={"nan": 10}) as (
        daemon,
        job,
    ):
        wait_for(lambda: hook.alerts("nonfinite"), 30, "the non-finite finding")
        [alert] = hook.alerts("nonfinite")
        assert alert["labels"]["run"] == "team-a/job" and "rank" not in alert["labels"]
        [finding] = _status(daemon, capsys)["findings"]
        assert (finding["run"], finding["rank"], finding["step"]) == ("team-a/job", "", 10)
        capsys.readouterr()
        assert main(["status", "--address", daemon.address, "--json", "--token", theirs]) == 0
        assert json.loads(capsys.readouterr().out)["findings"] == []
        job.stop()
        wait_for(lambda: hook.alerts("nonfinite", "resolved"), 30, "the resolution")
        assert hook.alerts("nonfinite", "resolved")[0]["annotations"]["summary"] == "the run's sessions closed"


STEADY_S = float(os.environ.get("WATCH_STEADY_S", "60"))


@pytest.mark.slow
@pytest.mark.timeout(STEADY_S + 180)
def test_a_steady_job_with_a_training_runs_noise_gives_no_finding(tmp_path: Path) -> None:
    """Four ranks log a training run's loss (decaying, 5% noise, a lone spike of up to 3x now and then, jittered
    step times, a 2 s evaluation pause every 1,000 steps) for `WATCH_STEADY_S` seconds (60; the target's 600 is
    `python -m benchmarks.watch_alerts --only steady`): no finding in the webhook, the metrics or the log."""
    row, met = steady(tmp_path, 4, STEADY_S)
    assert met, row


def test_runs_beyond_max_runs_are_not_watched_and_a_closed_run_is_forgotten(tmp_path: Path, hook: Hook) -> None:
    """Three runs written at once (writers in this process, over loopback) to a daemon watching at most two: two
    are followed, the last to come is said in the log and not watched (its NaN finds nothing); once the runs
    closed, the watch follows none."""
    daemon = _daemon(tmp_path, hook, "max_runs = 2\n")
    try:
        writers = [SummaryWriter(f"many/run-{i}", address=daemon.address) for i in range(3)]
        for step in range(5):
            for writer in writers:
                writer.add_scalar("loss", 1.0 / (step + 1), step)
        for writer in writers:
            writer.flush()
        wait_for(lambda: "not watched: 2 runs are" in daemon.log(), 10, "a run beyond the bound")
        assert _metrics(daemon)[("summaryd_watch_runs", ())] == 2
        left_out = daemon.log().split("watch: run many/run-")[1].split(" not watched")[0]  # the last to come
        writers[int(left_out)].add_scalar("loss", float("nan"), 5)
        writers[int(left_out)].flush()
        for writer in writers:
            writer.close()
        wait_for(lambda: _metrics(daemon)[("summaryd_watch_runs", ())] == 0, 10, "the closed runs forgotten")
    finally:
        daemon.stop()
    assert hook.messages == []
