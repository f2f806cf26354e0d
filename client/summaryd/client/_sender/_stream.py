"""One `Write` stream of a sender: requests go through a queue that gRPC consumes; a thread reads the acks."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

import grpc

from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc


class WriteStream:
    """A bidirectional `Write` call. `on_ack` and `on_end` run on the stream's own ack thread."""

    def __init__(
        self,
        stub: pb_grpc.SummariesStub,
        on_ack: Callable[[pb.WriteAck], None],
        on_end: Callable[[WriteStream, grpc.RpcError | None], None],
    ) -> None:
        self._outgoing: queue.SimpleQueue[pb.WriteRequest | None] = queue.SimpleQueue()
        self._on_ack = on_ack
        self._on_end = on_end
        self.error: grpc.RpcError | None = None
        self.ended = False
        self.call = stub.Write(self._requests())
        self._reader = threading.Thread(target=self._read, name="summaryd-acks", daemon=True)
        self._reader.start()

    def _requests(self) -> Iterator[pb.WriteRequest]:
        while (request := self._outgoing.get()) is not None:
            yield request

    def send(self, request: pb.WriteRequest) -> None:
        self._outgoing.put(request)

    def _read(self) -> None:
        error: grpc.RpcError | None = None
        try:
            for ack in self.call:
                self._on_ack(ack)
        except grpc.RpcError as exc:
            error = exc
        self.error = error
        self.ended = True
        self._on_end(self, error)

    def close(self, *, cancel: bool, timeout: float) -> None:
        """End the stream (half-close, or cancel) and wait for the ack thread."""
        self._outgoing.put(None)
        if cancel:
            self.call.cancel()
        self._reader.join(timeout)
        if self._reader.is_alive():
            self.call.cancel()
            self._reader.join(1.0)
