"""A stand-in for a daemon fooled by a forged lease, for the redirect tests of the client and of the relay."""

from __future__ import annotations

import grpc

from _support import Loopback
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import OWNER_ADDRESS_KEY


class _Redirecting(pb_grpc.SummariesServicer):
    """Answers every `OpenSession` as a daemon whose run another daemon's lease names: FAILED_PRECONDITION with
    that address in the trailing metadata."""

    def __init__(self, owner: str) -> None:
        self.owner = owner

    def OpenSession(self, request: pb.OpenSessionRequest, context: grpc.ServicerContext) -> pb.OpenSessionResponse:
        context.set_trailing_metadata(((OWNER_ADDRESS_KEY, self.owner),))
        context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"run {request.run!r} is written by the daemon at {self.owner}; open the session there",
        )
        raise AssertionError("abort raises")


def fooled_daemon(owner: str) -> Loopback:
    """Stands in for a daemon fooled by a forged lease: it sends every session to `owner`."""
    return Loopback(_Redirecting(owner))
