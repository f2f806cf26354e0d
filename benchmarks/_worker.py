"""One trial in a fresh process: `python -m benchmarks._worker TRIAL PARAMS_JSON RESULT_FILE`.

The trial sets up (imports, opens its writer), prints `ready`, waits for `go` on stdin, runs the timed part
and writes its result as JSON. A fresh process per trial keeps trials from sharing a heap, threads or a
warmed-up channel, and lets several clients start at the same moment.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from benchmarks import (
    aggregation,
    caller_cost,
    ceiling,
    close_latency,
    cpu_cost,
    memory,
    payloads,
    sessions,
    throughput,
    visibility,
)

Prepare = Callable[[Mapping[str, Any]], Callable[[], dict[str, Any]]]

TRIALS: dict[str, Prepare] = {
    "caller_cost": caller_cost.prepare,
    "throughput": throughput.prepare,
    "daemon_feed": ceiling.prepare_feed,
    "raw_framing": ceiling.prepare_framing,
    "payload": payloads.prepare,
    "visibility": visibility.prepare,
    "close_latency": close_latency.prepare,
    "daemon_memory": memory.prepare_daemon,
    "client_memory": memory.prepare_client,
    "cpu_cost": cpu_cost.prepare,
    "sessions": sessions.prepare,
    "aggregation_feed": aggregation.prepare,
}


def main(argv: list[str]) -> int:
    name, params, result_file = argv
    run = TRIALS[name](json.loads(params))
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    result = run()
    Path(result_file).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
