"""The edge: who may call (tokens), what is refused and logged, the limits, the bounds on every request field."""
