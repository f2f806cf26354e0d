"""Import gRPC with its core fork handlers off, when this module is the first to import it.

gRPC core (as grpcio builds it) registers `pthread_atfork` handlers that, when no thread happens to be inside
a gRPC call at the moment of a fork, re-initialise gRPC in the child: they restart its timer and executor
threads there, which then run the parent's pending gRPC work on the inherited channel. In a training process
whose client threads come and go from gRPC calls, a DataLoader fork can hit that moment, and the child then
aborts inside gRPC (`ev_epoll1_linux.cc: Check failed: next_worker->state == KICKED`, or `->initialized_cv`)
even though it never uses gRPC: a forked child of a client process does not (see `_courier`). So the client
turns gRPC's fork support off with `GRPC_ENABLE_FORK_SUPPORT=false`.

gRPC core does not read the variable at import but at its first initialisation (the first channel), by which
time an import-only setting is gone. So, with the variable set, the client initialises and shuts down gRPC
core once (a completion queue made and freed: no thread is left running, no channel is opened), which has
core read and keep its settings; the variable is then removed so that subprocesses see the environment the
user gave (should that internal class be missing, the variable stays set: better than fork handlers that
abort the children of a training process). A value the user set is left alone, and so is a gRPC someone else
imported first.
"""

from __future__ import annotations

import importlib
import os
import sys

_VARIABLE = "GRPC_ENABLE_FORK_SUPPORT"

if "grpc" not in sys.modules and _VARIABLE not in os.environ:
    os.environ[_VARIABLE] = "false"
    import grpc  # noqa: F401

    try:
        # grpc_init (core reads its configuration, once per process), then grpc_shutdown as it is freed.
        importlib.import_module("grpc._cython.cygrpc").CompletionQueue()
    except Exception:  # a gRPC without this internal class: the variable stays set instead
        pass
    else:
        del os.environ[_VARIABLE]
