"""A channel to one of several daemons, for the command-line clients (`summaryd ship`, `summaryd replay`).

Like the writer's sender (`_sender._targets.DaemonTargets`), they talk to the daemons of `SUMMARYD_ADDRESS` /
`--address` one at a time: a daemon that cannot be reached gives way to the next, and a daemon that names the
run's owner (FAILED_PRECONDITION with `OWNER_ADDRESS_KEY`, a bucket logdir) sends the caller there, when it is
one of the addresses or of `redirect_allow`; a redirect elsewhere is refused (warned about at a limited rate)
and the next configured daemon tried, and when none is left the call raises `RedirectRefusedError`. Every call
they make resumes a session, so trying the same work again on another daemon doubles nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import grpc

from summaryd.client._channel import ChannelSettings, open_channel
from summaryd.client._sender._grpc_transport import owner_address
from summaryd.client._sender._status import Warnings
from summaryd.client._sender._targets import DaemonTargets, RedirectRefusedError
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

T = TypeVar("T")

AWAY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
"""Codes that say the daemon is not there (rather than that it refused)."""


class DaemonChannel:
    """The channel to the daemon of the moment among `addresses`, opened on first use, with `settings`;
    redirects are followed to `addresses` and `redirect_allow` only."""

    def __init__(
        self, addresses: tuple[str, ...], settings: ChannelSettings, redirect_allow: tuple[str, ...] = ()
    ) -> None:
        self._targets = DaemonTargets(addresses, redirect_allow)
        self._warnings = Warnings()
        self._tries = len(addresses) + 1  # each configured daemon, and the owner one of them names
        self._settings = settings
        self._channel: grpc.Channel | None = None

    @property
    def address(self) -> str:
        """The daemon talked to now."""
        return self._targets.current

    @property
    def stub(self) -> pb_grpc.SummariesStub:
        if self._channel is None:
            self._channel = open_channel(self._targets.current, self._settings)
        return pb_grpc.SummariesStub(self._channel)

    def failed(self, error: grpc.RpcError) -> bool:
        """A call failed with `error`: move to the run's owner when the daemon named one, or to the next daemon
        when this one is away. True when there is another daemon to try now.

        Raises:
            RedirectRefusedError: the daemon named an owner the caller was not given, and no other configured
                daemon is left to try.
        """
        owner = owner_address(error)
        if owner is not None:
            try:
                moved = self._targets.redirect(owner)
            except RedirectRefusedError as refused:
                self._warnings.warn("redirect", str(refused))
                moved = self._targets.move_on()
                if not moved:
                    raise
        elif error.code() in AWAY:
            moved = self._targets.move_on()
        else:
            return False
        if moved:
            self.close()
        return moved

    def call(self, work: Callable[[pb_grpc.SummariesStub], T], moved: Callable[[], None] | None = None) -> T:
        """`work(stub)`, done again on the next daemon while one is away or names another (each daemon once);
        `moved` is told before each new attempt (what was opened on the last daemon is not open on this one).

        Raises:
            grpc.RpcError: the last daemon's refusal, or every daemon was away.
            RedirectRefusedError: the last daemon named an owner the caller was not given.
        """
        for _ in range(self._tries - 1):
            try:
                return work(self.stub)
            except grpc.RpcError as exc:
                if not self.failed(exc):
                    raise
            if moved is not None:
                moved()
        try:
            return work(self.stub)
        except grpc.RpcError as exc:
            owner = owner_address(exc)
            refusal = None if owner is None else self._targets.refusal(owner)
            if refusal is None:
                raise
            self._warnings.warn("redirect", refusal)
            if self._targets.move_on():  # the next call starts on the next configured daemon
                self.close()
            raise RedirectRefusedError(refusal) from None

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
