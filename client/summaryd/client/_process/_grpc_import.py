"""Import gRPC with its core fork handlers off, when this module is the first to import it.

gRPC core (as grpcio builds it) registers `pthread_atfork` handlers that, when no thread happens to be inside
a gRPC call at the moment of a fork, re-initialise gRPC in the child. In a training process whose client
threads come and go from gRPC calls, a DataLoader fork can hit that moment, and the child then aborts inside
gRPC (`ev_epoll1_linux.cc: Check failed: next_worker->initialized_cv`) even though it never uses gRPC: a
forked child of a client process does not (see `_courier`). So the client imports gRPC with
`GRPC_ENABLE_FORK_SUPPORT=false`, read once at import; the variable is removed again so that subprocesses
see the environment the user gave. A value the user set is left alone, and so is a gRPC someone else
imported first.
"""

from __future__ import annotations

import os
import sys

_VARIABLE = "GRPC_ENABLE_FORK_SUPPORT"

if "grpc" not in sys.modules and _VARIABLE not in os.environ:
    os.environ[_VARIABLE] = "false"
    try:
        import grpc  # noqa: F401
    finally:
        del os.environ[_VARIABLE]
