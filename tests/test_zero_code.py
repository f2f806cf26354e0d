"""`summaryd run` and `summaryd.client.patch()`: torch's and tensorboardX's writers log through the daemon.

Each script runs in a child process, as a user's would: the patch changes the modules of the process it is in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _support import Daemon, event_files, read_events, summaryd_run, unused_port
from summaryd.client._patch import run_path

ATTRIBUTES = textwrap.dedent(
    """
    import json, os, sys
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.writer import FileWriter
    import tensorboardX

    seen = {}
    writer = SummaryWriter("runs/torch")
    seen["class"] = type(writer).__module__
    seen["log_dir"], seen["get_logdir"] = writer.log_dir, writer.get_logdir()
    seen["local_dir_made"] = os.path.isdir("runs/torch")
    seen["file_writer_is_writer"] = writer.file_writer is writer
    seen["all_writers"] = list(writer.all_writers)
    for step in range(5):
        writer.add_scalar("loss", step / 2, step)
    writer.flush(timeout=10)
    writer.close()
    seen["file_writer_closed"] = writer.file_writer
    seen["all_writers_closed"] = writer.all_writers
    writer._get_file_writer().add_scalar("after", 1.0, 9)  # torch's writer reopens, as Lightning expects
    writer.close()

    x = tensorboardX.SummaryWriter(logdir=os.path.abspath("tbx/run"))
    seen["x_logdir"] = x.logdir
    x.add_scalar("acc", 0.25, 1)
    x.close()
    f = FileWriter("plain")
    seen["file_writer_class"] = type(f).__name__
    f.close()
    seen["chained"] = os.environ.get("CHAINED")
    print(json.dumps(seen))
    """
)


def scalars(run_dir: Path) -> list[tuple[str, int, float]]:
    return [
        (v.tag, e.step, v.simple_value)
        for path in event_files(run_dir)
        for e in read_events(path)
        for v in e.summary.value
    ]


@pytest.mark.parametrize(
    ("log_dir", "root", "expected"),
    [
        ("lightning_logs/version_0", "", "lightning_logs/version_0"),
        ("./output/runs/Dec01_10-00-00_host", "exp", "exp/output/runs/Dec01_10-00-00_host"),
        ("/work/job/output/runs/x", "", "output/runs/x"),  # below the working directory
        ("/scratch/runs/x", "sweep/a", "sweep/a/scratch/runs/x"),
        ("../elsewhere/x", "", "work/elsewhere/x"),
        ("s3://bucket/logs/x", "r", "r/bucket/logs/x"),
        (".", "r", "r"),
        (".", "", "job"),
    ],
)
def test_a_local_log_dir_maps_to_a_run_path(log_dir: str, root: str, expected: str) -> None:
    assert run_path(log_dir, root, cwd="/work/job") == expected


@pytest.mark.parametrize(
    ("log_dir", "daemon_logdir", "expected"),
    [
        ("runs/linreg", "", "linreg"),  # torch's default root: `tensorboard --logdir runs` shows `linreg`
        ("runs/Dec01_10-00-00_host", "/srv/logs", "Dec01_10-00-00_host"),
        ("runs", "", "runs"),  # the root alone stays a run of its own
        ("output/runs/x", "", "output/runs/x"),  # only a first component names a root
        ("exp/a", "/data/exp", "a"),  # the daemon's logdir by name
        ("exp/a", "exp", "a"),  # `summaryd run` gives only the name of a daemon elsewhere
        ("exp/a", "s3://bucket/exp/", "a"),
        ("/work/job/data/logs/x", "/work/job/data/logs", "x"),  # inside the daemon's local logdir
        ("../shared/tb/y", "/work/shared/tb", "y"),
        ("/scratch/runs/x", "", "scratch/runs/x"),  # outside the working directory: its whole path
    ],
)
def test_a_log_dir_under_a_logdir_root_maps_below_that_root(log_dir: str, daemon_logdir: str, expected: str) -> None:
    assert run_path(log_dir, "", cwd="/work/job", daemon_logdir=daemon_logdir) == expected


def test_a_script_beside_the_daemon_s_logdir_lands_in_it_and_makes_no_empty_run(tmp_path: Path) -> None:
    """A daemon started with `--logdir ./runs` and a script writing `runs/linreg` beside it: the events land in
    `runs/linreg` (not `runs/runs/linreg`), and a writer that logs nothing leaves no directory there."""
    from _support import start_daemon

    work = tmp_path / "work"
    work.mkdir()
    daemon = start_daemon(tmp_path, logdir=work / "runs")
    try:
        script = textwrap.dedent(
            """
            import os
            from torch.utils.tensorboard import SummaryWriter
            with SummaryWriter("runs/linreg") as w:
                w.add_scalar("loss", 0.5, 1)
            SummaryWriter("runs/unused").close()
            SummaryWriter("elsewhere/unused").close()
            print(os.path.isdir("runs/unused"), os.path.isdir("elsewhere/unused"))
            """
        )
        done = summaryd_run(work, "--address", daemon.address, "--", sys.executable, "-c", script)
    finally:
        daemon.stop()
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]  # a local directory outside the daemon's logdir is made
    assert scalars(work / "runs" / "linreg") == [("loss", 1, 0.5)]
    assert not (work / "runs" / "runs").exists()
    assert not (work / "runs" / "unused").exists()
    assert "summaryd run: 3 writers delivered 1 events" in done.stderr


def test_summaryd_run_patches_torch_and_tensorboardx_writers(daemon: Daemon, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(ATTRIBUTES)
    # A sitecustomize of the user's own, which ours must still run.
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n")
    env = {**os.environ, "PYTHONPATH": str(theirs)}
    done = summaryd_run(
        work, "--address", daemon.address, "--run-root", "exp", "--", sys.executable, "train.py", env=env
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {
        "class": "summaryd.client._patch",
        "log_dir": "runs/torch",
        "get_logdir": "runs/torch",
        "local_dir_made": True,
        "file_writer_is_writer": True,
        "all_writers": ["runs/torch"],
        "file_writer_closed": None,
        "all_writers_closed": None,
        "x_logdir": str(work / "tbx" / "run"),
        "file_writer_class": "TorchFileWriter",
        "chained": "yes",
    }
    lines = done.stderr.splitlines()
    assert lines[0] == f"summaryd run: daemon {daemon.address}, run root exp: {sys.executable} train.py"
    assert lines[-1] == "summaryd run: 4 writers delivered 7 events, 0 undelivered, dropped none"
    assert scalars(daemon.logdir / "exp" / "torch") == [
        *(("loss", step, step / 2) for step in range(5)),
        ("after", 9, 1.0),
    ]
    assert scalars(daemon.logdir / "exp" / "tbx" / "run") == [("acc", 1, 0.25)]


def test_summaryd_run_exits_with_the_command_s_code(daemon: Daemon, tmp_path: Path) -> None:
    done = summaryd_run(tmp_path, "--address", daemon.address, "--", sys.executable, "-c", "raise SystemExit(3)")
    assert done.returncode == 3, done.stderr
    assert "0 writers delivered 0 events" in done.stderr
    usage = summaryd_run(tmp_path)
    assert usage.returncode == 2 and "give the command to run after '--'" in usage.stderr
    usage_line = summaryd_run(tmp_path, "--help").stdout.splitlines()[0]
    assert usage_line == (
        "usage: summaryd run [--address A] [--run-root R] [--ship DIR [--state FILE]] -- COMMAND [ARG ...]"
    )


def test_summaryd_run_hands_every_address_to_the_command(daemon: Daemon, tmp_path: Path) -> None:
    """The first daemon is away: the command's writer fails over to the second, as a writer given both would."""
    script = textwrap.dedent(
        """
        import os
        from torch.utils.tensorboard import SummaryWriter
        print(os.environ["SUMMARYD_ADDRESS"])
        with SummaryWriter("logs/both") as w:
            w.add_scalar("x", 1.5, 2)
        """
    )
    addresses = f"127.0.0.1:{unused_port()},{daemon.address}"
    done = summaryd_run(tmp_path, "--address", addresses, "--", sys.executable, "-c", script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == addresses
    assert scalars(daemon.logdir / "logs" / "both") == [("x", 2, 1.5)]
    assert done.stderr.splitlines()[-1].startswith("summaryd run: 1 writer delivered 1 events")


def test_patch_in_code_replaces_writers_imported_before_and_after(daemon: Daemon, tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import tensorboardX
        import summaryd.client
        summaryd.client.patch()
        summaryd.client.patch()  # twice: nothing more
        from torch.utils.tensorboard import SummaryWriter
        assert tensorboardX.SummaryWriter.__name__ == "TensorboardXSummaryWriter"
        with SummaryWriter("logs/a") as w:
            w.add_scalar("x", 2.0, 3)
        """
    )
    env = {**os.environ, "SUMMARYD_ADDRESS": daemon.address}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert scalars(daemon.logdir / "logs" / "a") == [("x", 3, 2.0)]


def test_summaryd_run_ships_what_native_writers_write_beside_the_command(daemon: Daemon, tmp_path: Path) -> None:
    """`--ship DIR`: event files the command writes itself (as a native writer does) reach the daemon by the time
    `summaryd run` exits, below the run root."""
    script = textwrap.dedent(
        """
        import sys
        from tensorboard.compat.proto.event_pb2 import Event
        from summaryd.v1.wire import frame

        def event(**fields):
            return frame(Event(wall_time=1.5, **fields).SerializeToString())

        with open(sys.argv[1] + "/events.out.tfevents.1.host", "wb") as f:
            f.write(event(file_version="brain.Event:2"))
            for step in range(7):
                e = Event(wall_time=1.5, step=step)
                e.summary.value.add(tag="native", simple_value=step)
                f.write(frame(e.SerializeToString()))
        """
    )
    native = tmp_path / "native"
    native.mkdir()
    done = summaryd_run(
        tmp_path,
        "--address",
        daemon.address,
        "--run-root",
        "job",
        "--ship",
        str(native),
        "--",
        sys.executable,
        "-c",
        script,
        str(native),
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1].startswith("summaryd run: ship delivered 7 records")
    assert scalars(daemon.logdir / "job") == [("native", step, float(step)) for step in range(7)]


AFTER_CLOSE = textwrap.dedent(
    """
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter("runs/fit")  # as Lightning: fit logs, closes the writer, then test logs to it again
    writer.add_scalar("train_loss", 0.5, 0)
    writer.add_scalars("cmp", {"a": 1.0}, 0)
    writer.close()
    writer.add_scalar("test_loss", 0.25, 1)
    writer.add_scalars("cmp", {"a": 2.0}, 1)
    writer.add_histogram("weights", [0.0, 1.0, 2.0], 1)
    writer.close()
    """
)


def test_logging_after_close_reopens_a_patched_writer_as_torch_does(daemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(AFTER_CLOSE)
    done = summaryd_run(tmp_path, "--address", daemon.address, "--", sys.executable, "train.py")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1].endswith("0 undelivered, dropped none"), done.stderr
    run = daemon.logdir / "fit"  # `runs/` is the logdir root
    assert [s for s in scalars(run) if s[0] != "weights"] == [("train_loss", 0, 0.5), ("test_loss", 1, 0.25)]
    assert scalars(run / "cmp_a") == [("cmp", 0, 1.0), ("cmp", 1, 2.0)]
    histograms = [v.tag for path in event_files(run) for e in read_events(path) for v in e.summary.value if v.histo.num]
    assert histograms == ["weights"]
