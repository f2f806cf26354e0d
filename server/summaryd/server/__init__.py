"""The summaryd daemon: receives events over gRPC and owns the TensorBoard event files of a logdir."""

from summaryd.server.config import Config

__all__ = ["Config"]
