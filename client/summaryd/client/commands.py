"""What the `summaryd` commands ask of the client: its channel (token and TLS as a training process has them),
the daemon addresses it would use, and the three things it does outside a training step — replay a spool, run
a command with torch's and tensorboardX's writers patched, ship a directory of event files.

These names stay where they are while the modules behind them move; the command line imports nothing else of
the client. Importing this module imports neither the daemon nor TensorFlow.
"""

from summaryd.client._channel import ChannelSettings, open_channel
from summaryd.client._environment import resolve_address, resolve_addresses, resolve_redirect_allow
from summaryd.client._patch._launch import run_command
from summaryd.client._patch._shipper import ShipError, Shipper, ShipTotals
from summaryd.client._sender._replay import ReplayResult, replay
from summaryd.client._sender._targets import RedirectRefusedError

__all__ = [
    "ChannelSettings",
    "RedirectRefusedError",
    "ReplayResult",
    "ShipError",
    "ShipTotals",
    "Shipper",
    "open_channel",
    "replay",
    "resolve_address",
    "resolve_addresses",
    "resolve_redirect_allow",
    "run_command",
]
