"""The daemon's I/O threads: every blocking file operation runs on them, never on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TypeVar

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
    future = asyncio.get_running_loop().run_in_executor(executor, function)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await future
        raise
