"""The caller's thread never encodes. Logging a large image (or histogram) runs exactly
the same Python code on the caller's thread as logging a small one — a copy and a queue append — and every PNG
encode and every bucketing runs on the sender thread.

Work is counted, not timed: spies wrap Pillow's `Image.save` (the PNG encoder both builder sets end in) and
the histogram builders, and record the thread of each call, and a profiler lists the Python functions the caller's
thread enters during each `add_*` call.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.tensorboard import summary as torch_summary

from _support import Daemon, event_files, read_events
from summaryd.client import SummaryWriter
from summaryd.client._api import _summaries, _torch

Call = tuple[str, str]


@pytest.fixture(params=["torch", "tensorboard"])
def builders(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run with torch's builders (torch is imported here), and again with the fallback set."""
    if request.param == "tensorboard":
        monkeypatch.setattr(_torch, "builders", lambda: None)
    yield request.param


@pytest.fixture
def encodes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, tuple[int, int]]]:
    """Every `Image.save` call: (thread name, format, image size)."""
    seen: list[tuple[str, str, tuple[int, int]]] = []
    real_save = Image.Image.save

    def spy(self: Image.Image, fp: Any, format: str | None = None, **params: Any) -> None:
        seen.append((threading.current_thread().name, str(format), self.size))
        real_save(self, fp, format, **params)

    monkeypatch.setattr(Image.Image, "save", spy)
    return seen


def calls_on_this_thread(action: Callable[[], None]) -> list[Call]:
    """The Python functions this thread enters while `action` runs (other threads are not profiled). The cyclic
    collector is off meanwhile: a collection would run whatever `gc.callbacks` hold (hypothesis, loaded by other
    tests in the same process, keeps one there) at a moment no call of the action chose."""
    entered: list[Call] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            entered.append((frame.f_code.co_filename, frame.f_code.co_name))

    collecting = gc.isenabled()
    gc.disable()
    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
        if collecting:
            gc.enable()
    return entered


def _writer(daemon: Daemon) -> SummaryWriter:
    # One batch byte limit above the large image, so that neither call wakes the sender early: both calls are
    # then the same append.
    return SummaryWriter("offload", address=daemon.address, worker="", max_batch_bytes=1 << 30)


def test_a_large_image_costs_the_caller_what_a_small_one_does(
    daemon: Daemon, builders: str, encodes: list[tuple[str, str, tuple[int, int]]]
) -> None:
    small = torch.rand(3, 8, 8)
    large = torch.rand(3, 1024, 1024)
    with _writer(daemon) as writer:
        writer.add_image("warm-up", small, 0)  # first use: the sender thread starts, builders are imported
        assert writer.flush(timeout=10).delivered == 1
        encodes.clear()

        small_calls = calls_on_this_thread(lambda: writer.add_image("image", small, 1))
        # Each call meets an empty queue (the first event of a batch wakes the sender; later ones do not).
        assert writer.flush(timeout=10).delivered == 2
        large_calls = calls_on_this_thread(lambda: writer.add_image("image", large, 2))
        on_caller = [e for e in encodes if e[0] == threading.current_thread().name]
        report = writer.flush(timeout=10)

    assert report.delivered == 3 and report.ok
    assert small_calls == large_calls, "the caller's thread ran different code for the large image"
    assert not any("PIL" in filename or name == "make_image" for filename, name in large_calls)
    assert on_caller == []
    assert [(fmt, size) for _, fmt, size in encodes] == [("PNG", (8, 8)), ("PNG", (1024, 1024))]
    assert all(thread.startswith("summaryd-sender[offload]") for thread, _, _ in encodes)


def test_histograms_are_bucketed_on_the_sender_thread(
    daemon: Daemon, builders: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    module = torch_summary if builders == "torch" else _summaries
    real_histogram = module.histogram

    def spy(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real_histogram(*args, **kwargs)

    monkeypatch.setattr(module, "histogram", spy)
    values = torch.randn(1_000_000)
    with _writer(daemon) as writer:
        writer.add_histogram("warm-up", torch.randn(10), 0)
        assert writer.flush(timeout=10).delivered == 1
        # Both over the size queued without the lock (`FAST_ITEM_BYTES`): the same path, whatever the size.
        small_calls = calls_on_this_thread(lambda: writer.add_histogram("weights", values[:100], 1))
        assert writer.flush(timeout=10).delivered == 2  # the large one meets an empty queue too
        large_calls = calls_on_this_thread(lambda: writer.add_histogram("weights", values, 2))
        values.zero_()  # the caller may change its tensor right away: the copy taken at the call is logged
        assert writer.flush(timeout=10).delivered == 3

    assert small_calls == large_calls
    assert threads == ["summaryd-sender[offload]"] * 3
    [path] = event_files(daemon.logdir / "offload")
    last = read_events(path)[-1].summary.value[0]
    if builders == "torch":
        assert last.histo.num == 1_000_000 and last.histo.max > 1
    else:
        buckets = np.frombuffer(last.tensor.tensor_content, dtype=np.float64).reshape(-1, 3)
        assert buckets[:, 2].sum() == 1_000_000 and buckets[-1, 1] > 1
