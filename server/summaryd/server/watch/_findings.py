"""Findings and their book: which are firing, the changes numbered in order, and the state that survives a restart.

A finding is known by its key, (rule, run, subject): it fires once when its rule's condition starts and resolves
once when it ends; while it fires, the condition holding again changes nothing. The book keeps the findings
firing in `watch.json` in the state directory (rewritten whole, atomically, after each change), so that a
daemon restarted mid-finding takes it up as firing and does not fire it again. The file is checked on load:
one that does not parse is kept aside as `damaged-<time>-watch.json` and the watch starts empty (its findings
then fire again: said in the log).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from summaryd.server.storage.state_file import replace_state_file

log = logging.getLogger(__name__)

STATE_NAME = "watch.json"
_VERSION = 1
KEPT_CHANGES = 1000

Key = tuple[str, str, str]
"""rule, run, subject"""


@dataclass(frozen=True)
class Finding:
    """One rule's condition in one run: what fired, where, and (once resolved) when it ended."""

    rule: str
    run: str
    subject: str
    rank: str
    step: int
    value: float
    summary: str
    fired_unix: float
    resolved_unix: float = 0.0
    sequence: int = 0
    # Rule state that must outlive a restart (divergence: the level it resolves under).
    detail: float = 0.0

    @property
    def key(self) -> Key:
        return self.rule, self.run, self.subject

    @property
    def state(self) -> str:
        return "resolved" if self.resolved_unix else "firing"


class FindingBook:
    """The findings firing, the last `KEPT_CHANGES` changes, and listeners told of each change (on the event
    loop; they must not block). `path` is the state file ("" keeps nothing across restarts)."""

    def __init__(self, path: str = "") -> None:
        self.path = path
        self.active: dict[Key, Finding] = {}
        self.changes: deque[Finding] = deque(maxlen=KEPT_CHANGES)
        self.sequence = 0
        self.listeners: list[Callable[[Finding], None]] = []
        self.restored = 0
        if path:
            self._load()

    def listen(self, *listeners: Callable[[Finding], None]) -> None:
        """Tell each of `listeners` of every change from now on, in the order given."""
        self.listeners.extend(listeners)

    def fire(self, finding: Finding) -> bool:
        """Fire `finding` unless its key fires already; True when it fired now."""
        if finding.key in self.active:
            return False
        self.sequence += 1
        fired = replace(finding, sequence=self.sequence)
        self.active[fired.key] = fired
        self._changed(fired)
        return True

    def resolve(self, key: Key, summary: str, step: int = 0) -> Finding | None:
        """Resolve the finding of `key` (saying `summary`) at the run's `step`, or the step after the finding's
        when the run is not beyond it (TensorBoard reads a point at a step not above the last as a restart and
        drops the last); None when it was not firing."""
        finding = self.active.pop(key, None)
        if finding is None:
            return None
        self.sequence += 1
        step = max(step, finding.step + 1)
        resolved = replace(finding, summary=summary, step=step, resolved_unix=time.time(), sequence=self.sequence)
        self._changed(resolved)
        return resolved

    def of_run(self, run: str) -> Iterator[Finding]:
        return (f for f in list(self.active.values()) if f.run == run)

    def since(self, sequence: int) -> list[Finding]:
        """The changes numbered above `sequence` still kept, oldest first."""
        return [change for change in self.changes if change.sequence > sequence]

    def _changed(self, finding: Finding) -> None:
        self.changes.append(finding)
        log.warning(
            "watch: %s %s run %s%s%s at step %d: %s",
            finding.rule,
            finding.state,
            finding.run,
            f" rank {finding.rank}" if finding.rank else "",
            f" ({finding.subject})" if finding.subject and finding.subject != finding.rank else "",
            finding.step,
            finding.summary,
        )
        for listener in self.listeners:
            try:
                listener(finding)
            except Exception:  # one output failing must not keep the others from hearing
                log.exception("watch: an output of findings failed")

    # ---- the state file ------------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The state to write, as it stands now (taken on the event loop, written off it by `save`)."""
        state = {"version": _VERSION, "sequence": self.sequence, "firing": [asdict(f) for f in self.active.values()]}
        return json.dumps(state, sort_keys=True).encode()

    def save(self, data: bytes) -> None:
        """Write `data` (a `snapshot`) as the state file: a temporary file, fsynced, renamed over it (blocking)."""
        if not self.path:
            return
        replace_state_file(self.path, [data])

    def _load(self) -> None:
        try:
            with open(self.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return
        try:
            state = json.loads(data)
            if not isinstance(state, dict) or state.get("version") != _VERSION:
                raise ValueError(f"version {state.get('version') if isinstance(state, dict) else None!r}")
            sequence = state["sequence"]
            if not isinstance(sequence, int) or sequence < 0:
                raise ValueError("sequence")
            findings = [_finding(item) for item in state["firing"]]
        except (ValueError, KeyError, TypeError) as exc:
            aside = os.path.join(os.path.dirname(self.path), f"damaged-{int(time.time())}-{STATE_NAME}")
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            log.error(
                "watch: %s is damaged (%s), kept aside as %s; the findings it held fire again when found again",
                self.path,
                exc,
                aside,
            )
            return
        self.sequence = max([sequence, *(f.sequence for f in findings)])
        self.active = {f.key: f for f in findings}
        self.restored = len(findings)
        if findings:
            log.info("watch: %d findings firing before the restart taken up (not fired again)", len(findings))


_TYPES: dict[str, tuple[type, ...]] = {
    f.name: (str,) if f.type == "str" else (int,) if f.type == "int" else (int, float) for f in fields(Finding)
}


def _finding(item: Any) -> Finding:
    """A `Finding` from its saved form. Raises ValueError, KeyError, TypeError: not one."""
    if not isinstance(item, dict) or set(item) != set(_TYPES):
        raise ValueError("a finding with other fields")
    for name, kinds in _TYPES.items():
        if not isinstance(item[name], kinds) or isinstance(item[name], bool):
            raise ValueError(f"a finding whose {name} is {item[name]!r}")
    finding = Finding(**item)
    if finding.resolved_unix:
        raise ValueError("a resolved finding among those firing")
    return finding
