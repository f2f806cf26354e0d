"""Operations: the daemon's metrics and its log lines."""
