"""Which daemon a sender talks to: the configured addresses in turn, or the one a daemon sent it to.

A redirect carries the client's token and client certificate wherever it leads, and a daemon names the
address a run's lease in the bucket gives, which anyone who can write the bucket can set. So a redirect is
followed only to an address the client was given: one of its addresses, or one of `redirect_allow`.
"""

from __future__ import annotations

from summaryd.client._environment import parse_address
from summaryd.v1.wire import address_key


class RedirectRefusedError(Exception):
    """A daemon sent the client to an address it was not given; the redirect was not followed."""


class DaemonTargets:
    """The daemon of the moment among `addresses`; moves on when one cannot be reached, follows redirects to
    an address of `addresses` or `redirect_allow` (compared by `address_key`, dialled as given there) and to no
    other."""

    def __init__(self, addresses: tuple[str, ...], redirect_allow: tuple[str, ...] = ()) -> None:
        if not addresses:
            raise ValueError("no daemon address to talk to")
        self._addresses = addresses
        # Each address as the user gave it, by what identifies it: a redirect dials the user's form, never the
        # daemon's.
        self._allowed = {address_key(a): a for a in reversed((*addresses, *redirect_allow))}
        self._index = 0
        self.current = addresses[0]

    def move_on(self) -> bool:
        """The next configured daemon (after the last, the first again); True when that is another address."""
        self._index = (self._index + 1) % len(self._addresses)
        return self._switch(self._addresses[self._index])

    def redirect(self, address: str) -> bool:
        """The daemon that owns the run, as another daemon named it; True when that is another address.

        Once it cannot be reached either, `move_on` goes on with the configured daemons.

        Raises:
            RedirectRefusedError: `address` is none the client was given (nothing changes).
        """
        given = self._given(address)
        if given is None:
            raise RedirectRefusedError(self.refusal(address) or "")
        return self._switch(given)

    def _given(self, address: str) -> str | None:
        """`address` as the user gave it, when it is one of theirs."""
        try:
            return self._allowed.get(address_key(parse_address(address)))
        except ValueError:
            return None

    def refusal(self, address: str) -> str | None:
        """Why a redirect to `address` is not followed (None: it is one the client was given)."""
        if self._given(address) is not None:
            return None
        return (
            f"the daemon at {self.current} sends this run's clients to {address[:200]!r}, which is neither one of "
            "the client's addresses nor in its redirect allow-list (redirect_allow, SUMMARYD_REDIRECT_ALLOW, "
            "--redirect-allow): not followed, and no token or certificate sent there"
        )

    def _switch(self, address: str) -> bool:
        changed = address != self.current
        self.current = address
        return changed
