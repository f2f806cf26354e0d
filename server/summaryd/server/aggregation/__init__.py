"""Cross-worker aggregation: a run's scalars reduced over its workers, written beside their runs."""
