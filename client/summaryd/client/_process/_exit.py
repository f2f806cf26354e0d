"""What the client does at the end of a process: interpreter exit and SIGTERM.

- Exit: `atexit` closes every sender (delivered, else spooled) within the longest `close_timeout`. A
  `multiprocessing` child exits through `os._exit` without atexit, so there a `multiprocessing` finalizer
  does the same.
- SIGTERM: when nothing else handles it (the disposition is still the default), the handler closes every
  sender within its timeout, then restores the default and re-raises the signal, so the process still dies
  of SIGTERM, as it would have, but only after its events are delivered or spooled.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import weakref
from types import FrameType
from typing import Protocol

from summaryd.client._process import _fork


class Closable(_fork.Forkable, Protocol):
    def begin_close(self, deadline: float) -> None: ...

    def close(self, timeout: float | None = None) -> object: ...

    def done(self) -> bool: ...


_live: weakref.WeakSet[Closable] = weakref.WeakSet()
_closing: set[Closable] = set()
_sigterm_installed = False
_multiprocessing_exit_pid = 0
_closing_all = False


def register(sender: Closable) -> None:
    """Track a new sender for fork and exit; install the SIGTERM handler when this process allows it."""
    _live.add(sender)
    _fork.live.add(sender)
    _install_sigterm_handler()


def unregister(sender: Closable) -> None:
    _live.discard(sender)
    _fork.live.discard(sender)
    _closing.discard(sender)


def keep_until_closed(sender: Closable) -> None:
    """`sender` began closing: keep it (its writer may be gone, or reopened in a new session) until `close()`
    or the exit finishes it, so that the exit waits for what it still delivers."""
    for finished in [s for s in _closing if s.done()]:
        finished.close(0.0)  # its thread ended: settle its account now rather than keep it until exit
    _closing.add(sender)


def close_all(timeout: float | None = None) -> None:
    """Close every sender of this process under one deadline (all of them start closing at once)."""
    global _closing_all
    if _closing_all:
        return
    _closing_all = True
    try:
        senders = [s for s in {*_live, *_closing} if s.owned_here()]
        if timeout is None:
            timeout = max((s.options.close_timeout for s in senders), default=5.0)
        deadline = time.monotonic() + timeout
        for sender in senders:
            sender.begin_close(deadline)
        for sender in senders:
            sender.close(max(0.0, deadline - time.monotonic()))
        if _fork.children is not None:
            _fork.children.drain(max(0.0, deadline - time.monotonic()))
    finally:
        _closing_all = False


def register_multiprocessing_exit() -> None:
    """In a `multiprocessing` child (which ends with `os._exit`), close the senders at its exit too."""
    global _multiprocessing_exit_pid
    if _multiprocessing_exit_pid == os.getpid() or "multiprocessing" not in sys.modules:
        return
    import multiprocessing
    import multiprocessing.util

    if multiprocessing.parent_process() is None:
        return
    _multiprocessing_exit_pid = os.getpid()
    multiprocessing.util.Finalize(None, close_all, exitpriority=100)


def _install_sigterm_handler() -> None:
    global _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    _sigterm_installed = True
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # not the main interpreter, or an embedding that forbids it
        pass


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    try:
        close_all()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _after_fork_in_child() -> None:
    global _closing_all
    _closing_all = False
    _closing.clear()  # the parent's to finish


atexit.register(close_all)
os.register_at_fork(after_in_child=_after_fork_in_child)
