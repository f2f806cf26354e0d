"""Logging set-up of the daemon: readable lines for people, or one JSON object a line for log shippers.

Log lines quote what clients send (hosts, run paths, session ids, refusal reasons), so every record passes
`SafeLineFilter` on its way out: each argument is cut to `MAX_VALUE_CHARS`, control, format (bidi) and
line-separator characters are escaped, and the whole message is cut to `MAX_MESSAGE_CHARS`. It sits on the
handler, not at the call sites, so that no call site can forget it: one event is always one line. A traceback
(the daemon's own failures only) follows its line with every line of it indented.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import unicodedata
from collections.abc import Callable
from typing import Any

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

MAX_VALUE_CHARS = 1024
"""Longest argument a log line quotes whole (a run path at its limit fits)."""
MAX_MESSAGE_CHARS = 4096
"""Longest message of one log line, after escaping."""

# Categories escaped in log lines: controls, format characters (bidi overrides), surrogates, private use,
# unassigned, and the line and paragraph separators some readers break lines at.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def _escape_char(char: str) -> str:
    escaped = _ESCAPES.get(char)
    if escaped is not None:
        return escaped
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _unsafe(char: str) -> bool:
    return char != " " and (char < " " or unicodedata.category(char) in _UNSAFE_CATEGORIES)


def escape(text: str) -> str:
    """`text` with every character that could break or disguise a log line written as a `\\` escape."""
    if text.isprintable() and "\\" not in text:  # the common case, checked in C
        return text
    return "".join(_escape_char(c) if c == "\\" or _unsafe(c) else c for c in text)


def cut(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[{len(text) - limit} more characters]"


def _cut_value(value: object) -> object:
    if isinstance(value, (int, float)) or value is None:  # bool is an int
        return value
    if isinstance(value, str):
        return cut(value, MAX_VALUE_CHARS)
    if isinstance(value, bytes):
        return value if len(value) <= MAX_VALUE_CHARS else cut(repr(value), MAX_VALUE_CHARS)
    text = str(value)  # an exception or another object: it may carry client text too
    return value if len(text) <= MAX_VALUE_CHARS else cut(text, MAX_VALUE_CHARS)


def safe_message(record: logging.LogRecord) -> str:
    """The record's message with every argument cut, control characters escaped, and the whole cut."""
    args = record.args
    if isinstance(args, tuple):
        record.args = tuple(_cut_value(a) for a in args)
    elif isinstance(args, dict):
        record.args = {k: _cut_value(v) for k, v in args.items()}
    try:
        message = record.getMessage()
    except Exception:  # a call site whose arguments do not fit its format: still one line, nothing lost
        message = f"{record.msg!s} {args!r}"
    finally:
        record.args = args
    return cut(escape(message), MAX_MESSAGE_CHARS)


class SafeLineFilter(logging.Filter):
    """Makes every record one safe line: see the module docstring. Attached to the daemon's handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.__dict__.get("summaryd_safe"):  # a record that reaches two handlers is escaped once
            record.msg, record.args = safe_message(record), None
            record.__dict__["summaryd_safe"] = True
        return True


class TextFormatter(logging.Formatter):
    """`_TEXT_FORMAT` lines; a traceback follows with each of its lines indented, so it forges no event line."""

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging.Formatter's name
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802 - logging.Formatter's name
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("    " + cut(escape(line), MAX_MESSAGE_CHARS) for line in text.splitlines())


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "message"}` plus `exception` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        # ASCII only: JSON escapes controls itself, but U+2028/U+2029 raw would break some readers' lines.
        return json.dumps(entry, ensure_ascii=True)


def configure_logging(level: str, log_format: str) -> None:
    """Send the daemon's logs to stderr as `text` or `json`."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = TextFormatter(_TEXT_FORMAT)
    handler.setFormatter(formatter)
    handler.addFilter(SafeLineFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class Throttle:
    """At most one log line per kind of event every `interval` seconds; the next line says how many were left out.

    A client that sends the same bad request in a loop must not flood the daemon's log, nor hide other kinds
    of trouble behind its own. Thread-safe; kinds are a few fixed strings, so the table stays small.
    """

    def __init__(
        self, logger: logging.Logger, interval: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, kind: str, message: str, *args: object) -> None:
        """Log `message % args` as a WARNING unless a line of `kind` was logged within the interval."""
        now = self._clock()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self._interval:
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
                return
            self._last[kind] = now
            suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            message += " (and %d more like this since the last such line, not logged)"
            args = (*args, suppressed)
        self._logger.warning(message, *args)
