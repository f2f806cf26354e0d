"""A logdir on object storage: the bucket, sealed segments, leases and run ownership, session state there."""
