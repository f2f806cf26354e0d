"""The daemon watches the training: silence (hung workers), non-finite values, divergence and stragglers, found
on the live stream right after each batch is written, and told to metrics, status, a webhook and TensorBoard.

`Watch` is the write observer (`runs.WriteObserver`) and ticker; `Rules` its settings (`--watch-rules`);
`FindingBook` the findings firing and their changes, kept across restarts; `Webhook` and `BoardWriter` two of
the outputs. DESIGN.md ("The watch") says where each rule runs and what it costs.
"""

from summaryd.server.watch._board import BoardWriter
from summaryd.server.watch._findings import STATE_NAME, Finding, FindingBook
from summaryd.server.watch._rules import RULES, Rules
from summaryd.server.watch._watch import Watch
from summaryd.server.watch._webhook import Webhook, message

__all__ = ["RULES", "STATE_NAME", "BoardWriter", "Finding", "FindingBook", "Rules", "Watch", "Webhook", "message"]
