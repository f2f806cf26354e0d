"""`run_to_completion`: blocking work on the I/O threads, its result or error back in the event loop, and a
cancelled caller held until the thread is done (its locks must not be released under a running write)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from summaryd.server.io_threads import io_executor, run_to_completion


async def test_the_result_and_the_error_of_the_work_come_back() -> None:
    executor = io_executor(2)
    try:
        assert await run_to_completion(executor, lambda: threading.current_thread().name) == "summaryd-io_0"

        def fail() -> None:
            raise OSError(28, "No space left on device")

        with pytest.raises(OSError, match="No space left"):
            await run_to_completion(executor, fail)
    finally:
        executor.shutdown()


async def test_a_cancelled_caller_returns_only_once_the_thread_is_done() -> None:
    executor = io_executor(1)
    started, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def work() -> str:
        started.set()
        release.wait()
        finished.append("written")
        return "written"

    try:
        task = asyncio.create_task(run_to_completion(executor, work))
        await asyncio.to_thread(started.wait)
        task.cancel()
        for _ in range(20):  # the loop turns; the caller stays with the thread
            await asyncio.sleep(0)
        assert not task.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert finished == ["written"]
    finally:
        release.set()
        executor.shutdown()
