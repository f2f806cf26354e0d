"""The daemon's I/O threads: every blocking file operation runs on them, never on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")

THREAD_NAME_PREFIX = "summaryd-io"


def io_executor(threads: int) -> ThreadPoolExecutor:
    """The executor of the daemon's file I/O (`--io-threads`); its threads are named `summaryd-io_<n>`."""
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix=THREAD_NAME_PREFIX)


async def run_to_completion(executor: Executor, function: Callable[[], T]) -> T:
    """Run blocking file I/O on the executor and return its result.

    Even when the awaiting task is cancelled (a client hung up), the caller's locks stay held until the
    thread has finished: releasing them earlier would let a second write interleave with this one.
    """
    call = _Call(asyncio.get_running_loop(), function)
    executor.submit(call.run)
    return await call.result()


class _Call(Generic[T]):
    """One function run on an I/O thread, its outcome handed to the event loop by one `call_soon_threadsafe`.

    Leaner than `run_in_executor` under `shield`, which chains three futures with their callbacks per call:
    this runs once per batch written.
    """

    __slots__ = ("_done", "_finished", "_function", "_loop", "_outcome")

    def __init__(self, loop: asyncio.AbstractEventLoop, function: Callable[[], T]) -> None:
        self._loop = loop
        self._function = function
        self._done: asyncio.Future[T] = loop.create_future()
        self._finished: asyncio.Future[None] | None = None  # made only when the caller was cancelled meanwhile
        self._outcome: tuple[T | None, BaseException | None] | None = None

    def run(self) -> None:
        """On the I/O thread."""
        try:
            outcome: tuple[T | None, BaseException | None] = (self._function(), None)
        except BaseException as exc:  # handed to the caller, who raises it
            outcome = (None, exc)
        self._loop.call_soon_threadsafe(self._settle, outcome)

    def _settle(self, outcome: tuple[T | None, BaseException | None]) -> None:
        self._outcome = outcome
        done = self._done
        if not done.done():
            result, exc = outcome
            if exc is None:
                done.set_result(result)  # type: ignore[arg-type]
            else:
                done.set_exception(exc)
        if self._finished is not None and not self._finished.done():
            self._finished.set_result(None)

    async def result(self) -> T:
        try:
            return await self._done
        except asyncio.CancelledError:
            if self._outcome is None:  # still running: wait for the thread before the caller's locks go
                self._finished = self._loop.create_future()
                with contextlib.suppress(Exception):
                    await self._finished
            raise
