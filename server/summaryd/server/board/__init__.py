"""TensorBoard reads the daemon: the data provider service and the in-memory index it answers from."""
