"""What the client does at a fork: the child forgets the parent's senders; a child of a gRPC user avoids gRPC.

The child forgets the parent's senders' sessions, threads, gRPC channels and spool. It never closes or uses
them (the channel's socket is shared with the parent, whose stream must go on undisturbed; the objects are
kept alive forever so that no destructor runs on them), and when the parent had used gRPC the child does not
use gRPC at all: its senders write to outboxes that the parent's courier delivers (`_courier`). The fork waits
(briefly, bounded) for a sender thread that is in the middle of encoding an event: an encoder may be importing
a module, and a child forked during an import inherits that module's lock held by a thread it does not have,
and deadlocks on its first use.

This module is a leaf: the senders (through `_exit.register`) and the courier (`deliver_children_with`)
register with it; it imports neither.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
import weakref
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from summaryd.client._options import ClientOptions

log = logging.getLogger("summaryd.client")


class Forkable(Protocol):
    """What the fork handlers need of a sender."""

    @property
    def options(self) -> ClientOptions: ...

    def owned_here(self) -> bool: ...

    def forget_parent_after_fork(self) -> None: ...

    def pause_for_fork(self, timeout: float) -> bool: ...

    def resume_after_fork(self) -> None: ...


class ChildDelivery(Protocol):
    """What delivers the outboxes of this process's forked children (the courier, which registers itself)."""

    def watch(self, options: ClientOptions) -> None: ...

    def drain(self, timeout: float) -> None: ...


live: weakref.WeakSet[Forkable] = weakref.WeakSet()
pid = os.getpid()
"""This process's id, kept current by the fork handler below: reading it costs the caller's hot path nothing,
where `os.getpid()` is a system call."""
# This process opened gRPC channels (its pid), so its forked children must not use gRPC.
_grpc_pid: int | None = None
# In a forked child: the ancestor whose courier delivers this process's outboxes.
_outbox_pid: int | None = None
children: ChildDelivery | None = None
"""What delivers this process's children's outboxes, once the courier registered (`deliver_children_with`)."""


def deliver_children_with(delivery: ChildDelivery) -> None:
    """After a fork of a process that used gRPC, have `delivery` watch its senders' children's outboxes."""
    global children
    children = delivery


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


_paused: list[Forkable] = []
_FORK_WAIT = 5.0
_warned_fork_support = False


def _before_fork() -> None:
    global _warned_fork_support
    if (
        not _warned_fork_support
        and os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "").lower() in ("1", "true", "yes")
        and any(s.owned_here() for s in list(live))
    ):
        _warned_fork_support = True
        log.warning(
            "summaryd: GRPC_ENABLE_FORK_SUPPORT is on; gRPC's fork support can deadlock a child forked while a "
            "summaryd client streams (its threads are inside gRPC calls). summaryd's children do not use gRPC "
            "and need no fork support: unset GRPC_ENABLE_FORK_SUPPORT"
        )
    deadline = time.monotonic() + _FORK_WAIT
    for sender in list(live):
        if sender.owned_here() and sender.pause_for_fork(max(0.0, deadline - time.monotonic())):
            _paused.append(sender)


def _after_fork_in_parent() -> None:
    while _paused:
        _paused.pop().resume_after_fork()
    if _grpc_pid == os.getpid() and children is not None:
        for sender in list(live):
            if sender.owned_here():
                children.watch(sender.options)


def _after_fork_in_child() -> None:
    global _grpc_pid, _outbox_pid, pid
    pid = os.getpid()
    _paused.clear()
    if _outbox_pid is None and _grpc_pid is not None:
        _outbox_pid = _grpc_pid
    _grpc_pid = None
    for sender in list(live):
        sender.forget_parent_after_fork()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
