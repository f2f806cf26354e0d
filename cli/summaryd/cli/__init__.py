"""The `summaryd` command line, on top of the client and the daemon and using only their public names.

Each command is one module holding its parser and the one function that runs it (`_commands.Command`);
`main` builds the parser from the table in `_main` and dispatches. `serve` maps flags and `SUMMARYD_*`
variables onto the daemon's `Config`; `status`, `health` and `watch` ask a daemon; `replay`, `run` and `ship` call
`summaryd.client.commands`.
"""

from summaryd.cli._main import build_parser, main
from summaryd.cli._serve import config_from

__all__ = ["build_parser", "config_from", "main"]
