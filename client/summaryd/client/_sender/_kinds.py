"""The kinds of queued events: the first field of each tuple the caller's queue holds (see `_items.Queued`)."""

SOURCE = 0
"""`(SOURCE, serialized bytes or a function for them, estimated bytes)`."""
SUMMARY = 1
"""`(SUMMARY, serialized Summary, step, wall_time, estimated bytes)`."""
SCALAR = 2
"""`(SCALAR, tag, value, step, wall_time, estimated bytes)`. The largest kind: `EventQueue.take_scalars` tells a
run of scalars by the smallest kind in it."""
