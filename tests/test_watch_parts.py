"""The watch's parts on their own: the rules file and its errors, the findings' state file across a restart (and
a damaged one), the webhook's retries against a real loopback receiver, and `--no-watch`."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from _webhook_receiver import Receiver
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from _support import start_daemon, wait_for
from summaryd.cli import main
from summaryd.server.config import Config
from summaryd.server.records.event_check import check_and_frame
from summaryd.server.records.scalar_events import EventBatch
from summaryd.server.records.scalar_records import ScalarRecords
from summaryd.server.watch import Finding, FindingBook, Rules, Webhook, _webhook, message
from summaryd.server.watch._run_watch import RunWatch, Worker
from summaryd.v1 import summaryd_pb2 as pb


def _finding(**changes: object) -> Finding:
    fields: dict[str, object] = {
        "rule": "nonfinite",
        "run": "job",
        "subject": "loss",
        "rank": "rank-3",
        "step": 40,
        "value": float("nan"),
        "summary": "loss is nan on rank-3 at step 40",
        "fired_unix": 1_800_000_000.0,
    }
    return Finding(**{**fields, **changes})  # type: ignore[arg-type]


RULES_TOML = '[divergence]\ntags = ["val/*"]\nratio = 3\nruns = ["prod/*"]\n[straggler]\nenabled = false\n'
RULES_YAML = 'divergence:\n  tags: ["val/*"]\n  ratio: 3\n  runs: ["prod/*"]\nstraggler:\n  enabled: false\n'


@pytest.mark.parametrize(
    ("name", "text"), [("rules.toml", RULES_TOML), ("rules.yaml", RULES_YAML)], ids=["toml", "yaml"]
)
def test_the_rules_file_tunes_rules_and_runs(tmp_path: Path, name: str, text: str) -> None:
    rules_file = tmp_path / name
    rules_file.write_text(text)
    rules = Config.from_options(watch_rules=str(rules_file), silent_after=30).watch.rules
    assert rules.divergence.tags == ("val/*",) and rules.divergence.ratio == 3.0
    assert rules.applies("divergence", "prod/a") and not rules.applies("divergence", "dev/a")
    assert not rules.applies("straggler", "prod/a") and rules.applies("silence", "dev/a")
    assert rules.silence.after_secs == 30.0  # --silent-after
    assert Rules.load("") == Rules()
    (tmp_path / "empty.yml").write_text("")
    assert Rules.load(str(tmp_path / "empty.yml")) == Rules()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("- silence\n", "a YAML file of rules is a mapping"),
        ("silence: {after_secs: soon}\n", "after_secs must be a number"),
        ("silence: {after_secs: [\n", "not YAML"),
        ("[divergance]\n", "no rule or setting 'divergance'"),
        ("[divergence]\nratio = 0.5\n", "factor and ratio must be above 1"),
        ("[silence]\nafter_secs = 'soon'\n", "after_secs must be a number"),
        ("[nonfinite]\ntags = 'loss'\n", "tags must be a list of patterns"),
        ("[silence\n", "not TOML"),
    ],
)
def test_a_bad_rules_file_is_one_line_naming_what_to_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, said: str
) -> None:
    rules_file = tmp_path / ("rules.toml" if "=" in text or text.startswith("[") else "rules.yaml")
    rules_file.write_text(text)
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--logdir", str(tmp_path / "runs"), "--watch-rules", str(rules_file)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "--watch-rules" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


def test_findings_firing_are_taken_up_after_a_restart_and_a_damaged_state_is_kept_aside(tmp_path: Path) -> None:
    path = str(tmp_path / "watch.json")
    book = FindingBook(path)
    assert book.fire(_finding()) and not book.fire(_finding(step=41))  # fires once
    book.fire(_finding(rule="divergence", subject="loss", detail=0.75))
    book.save(book.snapshot())
    again = FindingBook(path)
    assert again.restored == 2 and again.sequence == 2
    assert not again.fire(_finding(step=50))  # firing before the restart: not fired twice
    assert again.active[("divergence", "job", "loss")].detail == 0.75
    resolved = again.resolve(("nonfinite", "job", "loss"), "finite again", step=60)
    assert resolved is not None and resolved.sequence == 3 and resolved.step == 60 and resolved.state == "resolved"
    (tmp_path / "watch.json").write_text('{"version": 1, "sequence": 4, "firing": [{"rule": 3}]}')
    damaged = FindingBook(path)
    assert damaged.active == {} and not (tmp_path / "watch.json").exists()
    assert [p.name.endswith("-watch.json") for p in tmp_path.glob("damaged-*")] == [True]


@pytest.mark.parametrize(
    ("codes", "posts", "outcome"),
    [([503, 503], 3, "sent"), ([400], 1, "failed")],
    ids=["a failing receiver is retried with backoff", "a refusal is not retried"],
)
def test_the_webhook_retries_what_may_succeed_later(codes: list[int], posts: int, outcome: str) -> None:
    receiver = Receiver(codes)
    webhook = Webhook(receiver.url)
    try:
        webhook.tell(_finding())
        wait_for(lambda: getattr(webhook, outcome) == 1, 20, f"the message {outcome}")
    finally:
        webhook.stop()
        receiver.close()
    assert len(receiver.bodies) == posts and len(set(receiver.bodies)) == 1
    assert json.loads(receiver.bodies[0]) == message(_finding())


def test_a_receiver_that_stops_answering_holds_up_no_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiver takes the first message and answers nothing: telling more never waits (the event loop only
    appends); beyond the queue's bound (3 here) the oldest waiting message gives way, counted; once the receiver
    answers, what was kept goes out in order."""
    monkeypatch.setattr(_webhook, "QUEUE_BOUND", 3)
    hold = threading.Event()
    receiver = Receiver(hold=hold)
    webhook = Webhook(receiver.url)
    try:
        webhook.tell(_finding(step=1))
        wait_for(lambda: len(receiver.bodies) == 1, 20, "the first message taken")
        for step in range(2, 7):
            webhook.tell(_finding(step=step))
        assert webhook.dropped == 2
        hold.set()
        wait_for(lambda: webhook.sent == 4, 20, "the messages kept sent")
    finally:
        hold.set()
        webhook.stop()
        receiver.close()
    steps = [json.loads(body)["alerts"][0]["annotations"]["step"] for body in receiver.bodies]
    assert steps == ["1", "4", "5", "6"]


def test_many_tags_and_tag_tables_keep_a_runs_watch_bounded() -> None:
    """A run whose batches bring 6,000 tags, in 600 different tag tables, of which divergence watches every one:
    the watch keeps at most `max_series` series (the other points counted unwatched), and its caches of which
    rules want a tag and a tag table stay within their bounds."""
    rules = Rules(max_series=100)
    room = [rules.max_series]

    def series_room() -> bool:
        room[0] -= 1
        return room[0] >= 0

    run = RunWatch("job", rules, series_room, time.time)
    worker = Worker("rank-0", None)
    for table in range(600):
        tags = [f"loss/{table}/{i}" for i in range(10)]
        columns = pb.ScalarColumns(
            tags=tags, tag_index=list(range(10)), step=[table] * 10, wall_time=[1.0] * 10, value=[0.5] * 10
        )
        run.take(worker, ScalarRecords(columns), float(table))
    assert len(run.series) == 100 and run.series_refused == 5_900
    assert len(run._tag_rules) <= 4096 and len(run._plans) <= 256


def _framed_loss(first_step: int, values: list[float]) -> ScalarRecords:
    """A batch of `loss` points from `first_step` on, framed as the daemon frames it before the watch sees it."""
    count = len(values)
    columns = pb.ScalarColumns(
        tags=["loss"],
        tag_index=[0] * count,
        step=range(first_step, first_step + count),
        wall_time=[1.0] * count,
        value=values,
    )
    records = ScalarRecords(columns)
    records.framed()
    return records


def _checked_loss(first_step: int, values: list[float]) -> EventBatch:
    """The same points as serialized events, checked as the daemon checks them before the watch sees them."""
    batch = EventBatch(
        Event(
            wall_time=1.0, step=step, summary=Summary(value=[Summary.Value(tag="loss", simple_value=value)])
        ).SerializeToString()
        for step, value in enumerate(values, first_step)
    )
    check_and_frame(batch)
    return batch


@pytest.mark.parametrize("batch_of", [_framed_loss, _checked_loss], ids=["scalar columns", "serialized events"])
def test_large_batches_reach_the_divergence_ring_point_for_point_and_a_rise_fires_at_its_step(
    batch_of: Callable[[int, list[float]], Sequence[bytes]],
) -> None:
    """Batches over 128 scalars (scalar columns read as arrays when framed, serialized events read as columns by
    their check) give a series' ring exactly the points sent, the newest 128 in order, before any threshold
    exists; once it has one, a batch that rises above it fires divergence at the first step over it."""
    run = RunWatch("job", Rules(), lambda: True, time.time)
    worker = Worker("rank-0", None)
    # float32 values, as the columns carry them: the ring holds each as the same float64.
    falling = [float(np.float32(2.0 / (1 + 0.01 * step))) for step in range(300)]
    first = batch_of(0, falling)
    assert getattr(first, "arrays", None) is not None or getattr(first, "usual", None) is not None  # as arrays
    run.take(worker, first, 1.0)
    series = run.series[("rank-0", "loss")]
    assert list(series.window[series.at :] + series.window[: series.at]) == falling[-128:]
    run.evaluate(2.0, workers=False)
    assert series.armed and 0.5 < series.threshold < 2.0
    steady, high = [falling[-1]] * 100, [5.0] * 100
    run.take(worker, batch_of(300, steady + high), 3.0)
    holds, _ = run.evaluate(4.0, workers=False)
    finding = holds[("divergence", "job", "loss")]
    assert (finding.rank, finding.step, finding.value) == ("rank-0", 400, 5.0)
    ordered = series.window[series.at :] + series.window[: series.at]
    assert list(ordered) == (falling + steady)[-128:]  # the points over the threshold are not the baseline


def test_a_nan_among_a_large_batch_of_serialized_events_fires_at_its_step() -> None:
    """Two finite points after it (fewer than the three that resolve it): the finding holds, at the NaN's step."""
    run = RunWatch("job", Rules(), lambda: True, time.time)
    worker = Worker("rank-3", None)
    values = [0.5] * 200
    values[197] = float("nan")
    run.take(worker, _checked_loss(1000, values), 1.0)
    holds, _ = run.evaluate(2.0, workers=False)
    finding = holds[("nonfinite", "job", "loss")]
    assert (finding.rank, finding.step, math.isnan(finding.value)) == ("rank-3", 1197, True)


def test_a_job_that_stops_at_once_is_named_silent_as_a_whole_from_the_first_message() -> None:
    """Three ranks of different cadences (thresholds 3.1 s, 3.2 s and 3.4 s) stop at once, a fourth logs on: the
    silence finding fires when the first is past its threshold, and already counts the three that stopped (each
    quiet past twice its cadence), not the one that logs; nothing fires before."""
    run = RunWatch("job", Rules(), lambda: True, time.time)
    cadences = {"rank-0": 0.05, "rank-1": 0.1, "rank-2": 0.2, "rank-3": 0.05}
    workers = {rank: Worker(rank, None) for rank in cadences}
    for rank, cadence in cadences.items():
        run.workers[rank] = workers[rank]
        for beat in range(8):
            workers[rank].arrived(100.0 - (7 - beat) * cadence)  # the last batch of each at 100.0
    workers["rank-3"].arrived(103.0)  # it logs on
    workers["rank-3"].arrived(103.05)
    assert run.evaluate(103.08)[0] == {}
    holds, _ = run.evaluate(103.15)
    finding = holds[("silence", "job", "")]
    assert finding.rank == "rank-0" and "3 of 4 workers silent" in finding.summary, finding.summary


def test_a_nan_in_many_tags_fires_a_bounded_number_of_findings() -> None:
    """NaN in 1,000 tags of one run: the non-finite rule follows `max_nonfinite_tags` of them (one finding each),
    the others' points counted unwatched, so a run's findings (and webhook messages) stay bounded."""
    rules = Rules(max_nonfinite_tags=16)
    run = RunWatch("job", rules, lambda: True, time.time)
    worker = Worker("rank-0", None)
    tags = [f"grad/{i}" for i in range(1000)]
    nan = float("nan")
    columns = pb.ScalarColumns(
        tags=tags, tag_index=list(range(1000)), step=[7] * 1000, wall_time=[1.0] * 1000, value=[nan] * 1000
    )
    run.take(worker, ScalarRecords(columns), 1.0)
    holds, _ = run.evaluate(2.0, workers=False)
    assert len([key for key in holds if key[0] == "nonfinite"]) == 16
    assert run.series_refused == 1000 - 16


def test_no_watch_says_so_in_status_and_watch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    daemon = start_daemon(tmp_path, "--no-watch")
    try:
        assert main(["status", "--address", daemon.address, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["watching"] is False
        assert main(["status", "--address", daemon.address]) == 0
        assert "WATCH off (--no-watch)" in capsys.readouterr().out
        assert main(["watch", "--address", daemon.address, "--once"]) == 1
        assert "the watch is off" in capsys.readouterr().err
    finally:
        daemon.stop()


def test_the_watch_package_exports_its_parts() -> None:
    from summaryd.server import watch

    names = ["RULES", "STATE_NAME", "BoardWriter", "Finding", "FindingBook", "Rules", "Watch", "Webhook", "message"]
    assert sorted(watch.__all__) == sorted(names) and all(hasattr(watch, name) for name in names)
