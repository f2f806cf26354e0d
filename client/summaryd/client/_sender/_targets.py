"""Which daemon a sender talks to: the configured addresses in turn, or the one a daemon sent it to."""

from __future__ import annotations


class DaemonTargets:
    """The daemon of the moment among `addresses`; moves on when one cannot be reached, follows redirects."""

    def __init__(self, addresses: tuple[str, ...]) -> None:
        if not addresses:
            raise ValueError("no daemon address to talk to")
        self._addresses = addresses
        self._index = 0
        self.current = addresses[0]

    def move_on(self) -> bool:
        """The next configured daemon (after the last, the first again); True when that is another address."""
        self._index = (self._index + 1) % len(self._addresses)
        return self._switch(self._addresses[self._index])

    def redirect(self, address: str) -> bool:
        """The daemon that owns the run, as another daemon named it; True when that is another address.

        Once it cannot be reached either, `move_on` goes on with the configured daemons."""
        return self._switch(address)

    def _switch(self, address: str) -> bool:
        changed = address != self.current
        self.current = address
        return changed
