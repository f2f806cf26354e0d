"""Sessions: the live ones and everything that happens to a session from its open to its end."""
