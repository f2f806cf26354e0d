"""Findings POSTed to `--watch-webhook URL` as Alertmanager's webhook receiver sends alerts (version 4).

Each change of a finding is one message of one alert: `status` firing or resolved, labels `alertname`
(`summaryd_<rule>`), `rule`, `run`, and `rank` and `tag` when the finding names them; annotations `summary`,
`step` and `value`; `startsAt`, and `endsAt` once resolved (Alertmanager's zero time, 0001-01-01T00:00:00Z,
while firing). A receiver written for Alertmanager takes them as they are.

Messages go through a bounded queue to a thread of their own: the event loop only appends. A send that fails
(no answer, a 5xx, 408 or 429) is retried with exponential backoff (0.5 s doubling up to 30 s, 8 attempts);
other 4xx answers are not retried (as Alertmanager's own retrier). Beyond the queue's bound the oldest waiting
message is dropped; failures and drops are counted and logged at a limited rate.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from summaryd.server.operations.logs import Throttle
from summaryd.server.watch._findings import Finding

log = logging.getLogger(__name__)
_failures = Throttle(log)

ZERO_TIME = "0001-01-01T00:00:00Z"
QUEUE_BOUND = 1000
ATTEMPTS = 8
FIRST_BACKOFF, LONGEST_BACKOFF = 0.5, 30.0
TIMEOUT = 5.0
_RETRIED = frozenset((408, 429))


def _time(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def alert_labels(finding: Finding) -> dict[str, str]:
    """The alert's labels: what identifies the finding (as Alertmanager groups and deduplicates by them)."""
    labels = {"alertname": f"summaryd_{finding.rule}", "rule": finding.rule, "run": finding.run}
    if finding.rank:
        labels["rank"] = finding.rank
    if finding.rule in ("nonfinite", "divergence"):
        labels["tag"] = finding.subject
    elif finding.rule == "straggler":
        labels["rank"] = finding.subject
    return labels


def message(finding: Finding) -> dict[str, Any]:
    """The webhook body for one change of `finding`, in Alertmanager's format (version 4)."""
    labels = alert_labels(finding)
    fingerprint = hashlib.sha256(json.dumps(sorted(labels.items())).encode()).hexdigest()[:16]
    alert = {
        "status": finding.state,
        "labels": labels,
        "annotations": {"summary": finding.summary, "step": str(finding.step), "value": f"{finding.value:.6g}"},
        "startsAt": _time(finding.fired_unix),
        "endsAt": _time(finding.resolved_unix) if finding.resolved_unix else ZERO_TIME,
        "generatorURL": "",
        "fingerprint": fingerprint,
    }
    group = {"alertname": labels["alertname"], "run": finding.run}
    return {
        "version": "4",
        "groupKey": "{}:{" + ", ".join(f'{k}="{v}"' for k, v in sorted(group.items())) + "}",
        "truncatedAlerts": 0,
        "status": finding.state,
        "receiver": "summaryd",
        "groupLabels": group,
        "commonLabels": labels,
        "commonAnnotations": alert["annotations"],
        "externalURL": "",
        "alerts": [alert],
    }


class Webhook:
    """Sends each finding's changes to `url` from a thread of its own; `tell` never blocks."""

    def __init__(self, url: str, registry: CollectorRegistry | None = None) -> None:
        self.url = url
        self._queue: queue.Queue[bytes | None] = queue.Queue(QUEUE_BOUND)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.sent = self.failed = self.dropped = 0
        self._failed = Counter(
            "summaryd_watch_webhook_failed", "Webhook messages given up after every attempt.", registry=registry
        )
        self._dropped = Counter(
            "summaryd_watch_webhook_dropped", "Webhook messages dropped: the queue was full.", registry=registry
        )

    def tell(self, finding: Finding) -> None:
        """Queue the message of `finding`'s change (on the event loop)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._send_all, name="summaryd-watch-webhook", daemon=True)
            self._thread.start()
        body = json.dumps(message(finding)).encode()
        while True:
            try:
                self._queue.put_nowait(body)
                return
            except queue.Full:
                try:
                    self._queue.get_nowait()  # the oldest waiting gives way
                    self.dropped += 1
                    self._dropped.inc()
                    _failures.warning("webhook-full", "watch: webhook %s is behind; oldest message dropped", self.url)
                except queue.Empty:
                    pass

    def stop(self, timeout: float = 2.0) -> None:
        """Send what is queued for up to `timeout` seconds, then stop the thread (safe to call twice)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        deadline = time.monotonic() + timeout
        while not self._queue.empty() and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.02)
        self._stopping.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        thread.join(max(deadline - time.monotonic(), 0.1))

    def _send_all(self) -> None:
        while not self._stopping.is_set():
            body = self._queue.get()
            if body is None:
                return
            self._send(body)

    def _send(self, body: bytes) -> None:
        backoff = FIRST_BACKOFF
        for attempt in range(1, ATTEMPTS + 1):
            problem = self._post(body)
            if problem is None:
                self.sent += 1
                return
            retried = not problem.startswith("HTTP 4") or any(problem.startswith(f"HTTP {c}") for c in _RETRIED)
            if not retried or attempt == ATTEMPTS or self._stopping.wait(backoff):
                break
            backoff = min(backoff * 2, LONGEST_BACKOFF)
        self.failed += 1
        self._failed.inc()
        _failures.warning("webhook", "watch: webhook %s not sent (%s)", self.url, problem)

    def _post(self, body: bytes) -> str | None:
        """POST one message; None when the receiver took it (2xx), else what went wrong."""
        request = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
                answer.read()
                return None
        except urllib.error.HTTPError as exc:
            return f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            return str(getattr(exc, "reason", exc))
