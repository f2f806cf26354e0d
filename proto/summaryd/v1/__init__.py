"""Generated protobuf and gRPC modules of the summaryd wire contract (`summaryd.proto`)."""
