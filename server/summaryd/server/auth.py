"""Bearer tokens and the run prefixes each may write, read from `--token-file` (re-read on SIGHUP).

The file holds one token a line, followed by the run prefixes it may write (`*` for every run)::

    # token                              prefixes
    9f2c1e0d7a5b4c3e8f1a2b3c4d5e6f70     team-a/ shared/eval
    4b1d9e8f7c6a5b4c3d2e1f0a9b8c7d6e     *

Tokens are compared in constant time and never logged; logs name a token by a short fingerprint.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

MIN_TOKEN_LENGTH = 16


@dataclass(frozen=True)
class Grant:
    """What one token may do: write runs under its prefixes."""

    fingerprint: str
    prefixes: tuple[str, ...]

    def allows(self, run_dir: str) -> bool:
        """True when `run_dir` is one of the prefixes or lies below one (`a/` and `a` both cover `a/b`)."""
        for prefix in self.prefixes:
            if prefix == "*":
                return True
            bare = prefix.rstrip("/")
            if run_dir == bare or run_dir.startswith(bare + "/"):
                return True
        return False


def fingerprint(token: str) -> str:
    """A short, non-reversible name for a token, safe to log."""
    return hashlib.sha256(token.encode()).hexdigest()[:10]


class TokenTable:
    """The tokens the daemon accepts."""

    def __init__(self, entries: Iterable[tuple[str, Sequence[str]]]) -> None:
        self._entries = [(token.encode(), Grant(fingerprint(token), tuple(prefixes))) for token, prefixes in entries]

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def load(cls, path: str | Path) -> TokenTable:
        """Parse a token file.

        Raises:
            ValueError: naming the line that is malformed (never quoting the token).
        """
        entries = []
        for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) < 2:
                raise ValueError(f"{path}:{number}: a token needs at least one run prefix (or '*')")
            token, prefixes = words[0], words[1:]
            if len(token) < MIN_TOKEN_LENGTH:
                raise ValueError(f"{path}:{number}: tokens must be at least {MIN_TOKEN_LENGTH} characters")
            if any(p.startswith("/") or ".." in p.split("/") for p in prefixes):
                raise ValueError(f"{path}:{number}: prefixes are run paths relative to the logdir, or '*'")
            entries.append((token, prefixes))
        if not entries:
            raise ValueError(f"{path}: no tokens; every client would be refused")
        return cls(entries)

    def grant_for(self, authorization: str | None) -> Grant | None:
        """The grant of an `authorization: Bearer <token>` value, or None when it is missing or wrong."""
        if not authorization or not authorization.startswith("Bearer "):
            return None
        offered = authorization[len("Bearer ") :].strip().encode()
        found: Grant | None = None
        # Compare with every token, so the time taken does not tell which one (or how much of one) matched.
        for token, grant in self._entries:
            if hmac.compare_digest(token, offered):
                found = grant
        return found
