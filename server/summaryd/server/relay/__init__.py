"""The node relay (`summaryd serve --upstream`): serves a node's clients and carries their sessions, many in
one message, to the upstream daemons that hold their runs; it keeps nothing durable."""

from summaryd.server.relay.service import RelayService, Upstreams

__all__ = ["RelayService", "Upstreams"]
