"""What the client does at the edges of a process's life: fork, interpreter exit, SIGTERM.

- Fork: the child forgets the parent's senders' sessions, threads, gRPC channels and spool. It never closes
  or uses them (the channel's socket is shared with the parent, whose stream must go on undisturbed; the
  objects are kept alive forever so that no destructor runs on them), and when the parent had used gRPC the
  child does not use gRPC at all: its senders write to outboxes that the parent's courier delivers
  (`_courier`). The fork waits (briefly, bounded) for a sender thread that is in the middle of encoding an
  event: an encoder may be importing a module, and a child forked during an import inherits that module's
  lock held by a thread it does not have, and deadlocks on its first use.
- Exit: `atexit` closes every sender (delivered, else spooled) within the longest `close_timeout`. A
  `multiprocessing` child exits through `os._exit` without atexit, so there a `multiprocessing` finalizer
  does the same.
- SIGTERM: when nothing else handles it (the disposition is still the default), the handler closes every
  sender within its timeout, then restores the default and re-raises the signal, so the process still dies
  of SIGTERM, as it would have, but only after its events are delivered or spooled.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import signal
import sys
import threading
import time
import weakref
from types import FrameType
from typing import Protocol

from summaryd.client._options import ClientOptions
from summaryd.client._process._courier import Courier

log = logging.getLogger("summaryd.client")


class Closable(Protocol):
    @property
    def options(self) -> ClientOptions: ...

    def owned_here(self) -> bool: ...

    def begin_close(self, deadline: float) -> None: ...

    def close(self, timeout: float | None = None) -> object: ...

    def done(self) -> bool: ...

    def forget_parent_after_fork(self) -> None: ...

    def pause_for_fork(self, timeout: float) -> bool: ...

    def resume_after_fork(self) -> None: ...


_live: weakref.WeakSet[Closable] = weakref.WeakSet()
_closing: set[Closable] = set()
# This process opened gRPC channels (its pid), so its forked children must not use gRPC.
pid = os.getpid()
"""This process's id, kept current by the fork handler below: reading it costs the caller's hot path nothing,
where `os.getpid()` is a system call."""
_grpc_pid: int | None = None
# In a forked child: the ancestor whose courier delivers this process's outboxes.
_outbox_pid: int | None = None
courier = Courier()
_sigterm_installed = False
_multiprocessing_exit_pid = 0
_closing_all = False


def register(sender: Closable) -> None:
    """Track a new sender for fork and exit; install the SIGTERM handler when this process allows it."""
    _live.add(sender)
    _install_sigterm_handler()


def unregister(sender: Closable) -> None:
    _live.discard(sender)
    _closing.discard(sender)


def keep_until_closed(sender: Closable) -> None:
    """`sender` began closing: keep it (its writer may be gone, or reopened in a new session) until `close()`
    or the exit finishes it, so that the exit waits for what it still delivers."""
    for finished in [s for s in _closing if s.done()]:
        finished.close(0.0)  # its thread ended: settle its account now rather than keep it until exit
    _closing.add(sender)


def note_grpc_used() -> None:
    """A sender of this process is about to open a gRPC channel."""
    global _grpc_pid
    _grpc_pid = os.getpid()


def outbox_owner() -> int | None:
    """The pid of the ancestor that delivers this process's events, when this process must not use gRPC."""
    return _outbox_pid if _outbox_pid != os.getpid() else None


def keep_forever(*objects: object) -> None:
    """Never free `objects` in this process (a child's inherited gRPC channel and streams): a destructor would
    act on the connection the parent still uses."""
    for obj in objects:
        if obj is not None:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


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
        courier.drain(max(0.0, deadline - time.monotonic()))
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


_paused: list[Closable] = []
_FORK_WAIT = 5.0
_warned_fork_support = False


def _before_fork() -> None:
    global _warned_fork_support
    if (
        not _warned_fork_support
        and os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "").lower() in ("1", "true", "yes")
        and any(s.owned_here() for s in list(_live))
    ):
        _warned_fork_support = True
        log.warning(
            "summaryd: GRPC_ENABLE_FORK_SUPPORT is on; gRPC's fork support can deadlock a child forked while a "
            "summaryd client streams (its threads are inside gRPC calls). summaryd's children do not use gRPC "
            "and need no fork support: unset GRPC_ENABLE_FORK_SUPPORT"
        )
    deadline = time.monotonic() + _FORK_WAIT
    for sender in list(_live):
        if sender.owned_here() and sender.pause_for_fork(max(0.0, deadline - time.monotonic())):
            _paused.append(sender)


def _after_fork_in_parent() -> None:
    while _paused:
        _paused.pop().resume_after_fork()
    if _grpc_pid == os.getpid():
        for sender in list(_live):
            if sender.owned_here():
                courier.watch(sender.options)


def _after_fork_in_child() -> None:
    global _closing_all, _grpc_pid, _outbox_pid, courier, pid
    pid = os.getpid()
    _closing_all = False
    _paused.clear()
    _closing.clear()  # the parent's to finish
    if _outbox_pid is None and _grpc_pid is not None:
        _outbox_pid = _grpc_pid
    _grpc_pid = None
    courier = Courier()
    for sender in list(_live):
        sender.forget_parent_after_fork()


atexit.register(close_all)
os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
