"""`patch()`: `torch.utils.tensorboard` and `tensorboardX` write through summaryd, without a change to the code.

This package is the client's zero-code part: `patch()` here, `summaryd run` (`_launch`, with the `sitecustomize`
of `_bootstrap`) and `summaryd ship` (`_shipper`) beside it.

Their `SummaryWriter` and `FileWriter` are replaced by subclasses of `summaryd.client.SummaryWriter` that take
the replaced class's constructor arguments. A module already imported is patched at once; one imported later is
patched right after it runs (an import hook on `sys.meta_path`, as the auto-instrumentation tools do), so
`patch()` never imports torch itself.

Where the summaries go: the framework's local `log_dir` maps to a run path by `run_path()`, below the run root
(`SUMMARYD_RUN_ROOT`). The writer keeps showing the local directory in `log_dir`/`get_logdir()` and creates it,
as torch does, since frameworks write files of their own there (Lightning's `hparams.yaml`); not when it lies
inside the daemon's own logdir, where the daemon makes it.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import socket
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType, ModuleType, TracebackType
from typing import Any

from summaryd.client._api._files import FileUploader
from summaryd.client._environment import detect_worker
from summaryd.client._patch._tensorboardx import TensorboardXFileWriterMethods, TensorboardXMethods
from summaryd.client._sender import DeliveryReport, Sender
from summaryd.client.writer import SummaryWriter, _merge

RUN_ROOT_ENV = "SUMMARYD_RUN_ROOT"
# The daemon's logdir (a path or a URL, as `summaryd status` shows it), set by `summaryd run`: see `run_path`.
DAEMON_LOGDIR_ENV = "SUMMARYD_DAEMON_LOGDIR"
# A file each patched writer appends its delivery report to when it closes (set by `summaryd run`).
REPORT_ENV = "SUMMARYD_RUN_REPORT"


def run_path(
    log_dir: str | os.PathLike[str], run_root: str = "", cwd: str | None = None, daemon_logdir: str = ""
) -> str:
    """The run path a framework's local `log_dir` maps to, below `run_root`.

    A relative directory keeps its path (`lightning_logs/version_0`), except that its first component is
    dropped when it names a logdir root: `runs` (torch's and tensorboardX's default root: `runs/linreg` →
    `linreg`, as `tensorboard --logdir runs` shows it), or the daemon's logdir by name (`daemon_logdir`, from
    `SUMMARYD_DAEMON_LOGDIR`; a daemon on `/data/exp` takes `exp/a` as `a`); a directory that is only that name
    maps as itself. A directory inside the daemon's logdir when that is a local absolute path (`local_dir_of`)
    maps to its path there. An absolute one is taken relative to the working directory when it lies below it,
    else it keeps its whole path without the leading `/` (`/scratch/exp/runs/x` → `scratch/exp/runs/x`), so
    two different directories never share a run. A URL (`s3://bucket/logs`) drops its scheme. The directory
    itself (`.`) maps to the run root, else to the working directory's name.
    """
    text = os.fspath(log_dir)
    cwd = cwd or os.getcwd()
    inside_daemon = _inside(text, cwd, daemon_logdir)
    if inside_daemon is not None:
        relative, below_cwd = inside_daemon, False
    elif "://" in text:
        relative, below_cwd = text.partition("://")[2], False
    else:
        absolute = os.path.normpath(os.path.join(cwd, text))
        below_cwd = absolute == cwd or absolute.startswith(cwd.rstrip(os.sep) + os.sep)
        relative = os.path.relpath(absolute, cwd) if below_cwd else absolute.lstrip(os.sep)
    # A backslash is a separator too (a Windows-style `logs\\exp`, which tensorboardX takes on any system).
    parts = [p for p in relative.replace(os.sep, "/").replace("\\", "/").split("/") if p not in ("", ".")]
    roots = {"runs", _name(daemon_logdir)} - {""}
    if below_cwd and len(parts) > 1 and parts[0] in roots:
        parts = parts[1:]
    root = [p for p in run_root.split("/") if p not in ("", ".")]
    return "/".join(root + parts) or os.path.basename(cwd.rstrip(os.sep)) or "run"


def _name(logdir: str) -> str:
    """The last component of a logdir path or URL (`./runs` → `runs`, `s3://bucket/exp/` → `exp`)."""
    return os.path.basename(os.path.normpath(logdir.partition("://")[2] or logdir)) if logdir else ""


def _inside(log_dir: str, cwd: str, daemon_logdir: str) -> str | None:
    """`log_dir`'s path inside `daemon_logdir` (a local absolute path), or None when it lies elsewhere."""
    if not daemon_logdir or "://" in daemon_logdir or "://" in log_dir or not os.path.isabs(daemon_logdir):
        return None
    root = os.path.realpath(daemon_logdir)
    absolute = os.path.realpath(os.path.join(cwd, log_dir))
    if absolute != root and not absolute.startswith(root.rstrip(os.sep) + os.sep):
        return None
    return os.path.relpath(absolute, root)


def local_dir_of_daemon(log_dir: str, daemon_logdir: str) -> bool:
    """Whether a framework's local `log_dir` lies inside the daemon's (local) logdir: the daemon makes it when
    its events arrive, so the writer does not (an empty directory there would show as a run)."""
    return _inside(log_dir, os.getcwd(), daemon_logdir) is not None


def _worker() -> str | None:
    """The launcher's worker label; else, under a `torch.distributed` job its launcher did not describe in the
    environment (a framework that spawns its own ranks), `rank-N` from the process group."""
    if detect_worker().label:
        return None  # the writer reads the environment itself
    distributed = sys.modules.get("torch.distributed")
    if distributed is None or not distributed.is_available() or not distributed.is_initialized():
        return None
    return f"rank-{distributed.get_rank()}" if distributed.get_world_size() > 1 else None


_live: weakref.WeakSet[PatchedWriter] = weakref.WeakSet()


class PatchedWriter(SummaryWriter):
    """A summaryd writer standing in for a framework's: the local directory it was given shows in `log_dir`, and
    logging after `close()` reopens it, as torch's `_get_file_writer` does."""

    reopens_on_use = True
    write_to_disk = True
    """False: a tensorboardX writer made muted, that ships nothing and creates no directory."""

    def __init__(
        self, local_dir: str | os.PathLike[str], purge_step: int | None, framework: str, **options: Any
    ) -> None:
        local = os.fspath(local_dir)
        worker = _worker()
        extra: dict[str, Any] = {} if worker is None else {"worker": worker}
        daemon_logdir = os.environ.get(DAEMON_LOGDIR_ENV, "")
        super().__init__(
            run_path(local, os.environ.get(RUN_ROOT_ENV, ""), daemon_logdir=daemon_logdir),
            purge_step=purge_step,
            framework=framework,
            **extra,
            **options,
        )
        self.log_dir = local
        if "://" not in local and self.write_to_disk and not local_dir_of_daemon(local, daemon_logdir):
            os.makedirs(local, exist_ok=True)
        _live.add(self)

    def _get_file_writer(self) -> PatchedWriter:
        """torch's: the file writer, opened again after `close()` (Lightning's `log_hyperparams` reaches it)."""
        self.reopen()
        return self

    def close(self, timeout: float | None = None) -> DeliveryReport:
        """`close()` (what frameworks call at the end of `fit` and `train`) costs the loop what torch's does: the
        writer stops taking events, has them sent now and returns what is known; the rest is delivered in the
        background and the process's exit waits for it (every writer under one deadline, `close_timeout`). A
        later event reopens the writer, as torch's does. `close(timeout=T)` waits up to `T` seconds, as
        `SummaryWriter.close` does."""
        if timeout is None:
            if not self._closed:
                self._close_in_background(time.monotonic() + self._options.close_timeout)
            return _merge([s.send_now() for s in (self.sender, *self._sub_senders.values())], self._uploader)
        was_open = not self._closed
        report = super().close(timeout)
        if was_open and self.write_to_disk:  # each session once (a writer reopened reports again)
            _append_report(self.run, report)
        return report

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # A `with` block is the script's own scope (frameworks call `close()`): leaving it waits, as torch's
        # writer has its files written when the block ends.
        self.close(timeout=self._options.close_timeout)

    def _close_in_background(self, deadline: float) -> None:
        senders = self._begin_close(deadline)
        _delivering.append((self.run, senders, self._uploader))


# The sessions of writers closed without a wait, still delivering: the exit finishes them and reports each.
_delivering: list[tuple[str, list[Sender], FileUploader | None]] = []
os.register_at_fork(after_in_child=_delivering.clear)  # the parent's to finish


def _append_report(run: str, report: DeliveryReport) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    line = json.dumps(
        {"run": run, "delivered": report.delivered, "undelivered": report.undelivered, "dropped": dict(report.dropped)}
    )
    # One write of one line with O_APPEND: lines of several processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _default_dir(comment: str) -> str:
    """torch's and tensorboardX's default: `runs/<Mon><DD>_<HH-MM-SS>_<host><comment>`."""
    return os.path.join("runs", datetime.now().strftime("%b%d_%H-%M-%S") + "_" + socket.gethostname() + comment)


class TorchSummaryWriter(PatchedWriter):
    """`torch.utils.tensorboard.SummaryWriter`, logging through summaryd."""

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        comment: str = "",
        purge_step: int | None = None,
        max_queue: int = 10,
        flush_secs: int = 120,
        filename_suffix: str = "",
    ) -> None:
        super().__init__(
            log_dir or _default_dir(comment),
            purge_step,
            "torch",
            max_queue=max_queue,
            flush_secs=flush_secs,
            filename_suffix=filename_suffix,
        )


class TorchFileWriter(PatchedWriter):
    """`torch.utils.tensorboard.writer.FileWriter`, logging through summaryd."""

    def __init__(
        self, log_dir: str | os.PathLike[str], max_queue: int = 10, flush_secs: int = 120, filename_suffix: str = ""
    ) -> None:
        super().__init__(
            log_dir, None, "torch", max_queue=max_queue, flush_secs=flush_secs, filename_suffix=filename_suffix
        )


# tensorboardX's default `comet_config` (comet logging is not done here; the argument is taken and kept).
_COMET_OFF: Mapping[str, Any] = MappingProxyType({"disabled": True})


class TensorboardXSummaryWriter(TensorboardXMethods, PatchedWriter):
    """`tensorboardX.SummaryWriter`, logging through summaryd: tensorboardX's methods and payloads (see
    `_tensorboardx`); `logdir` shows the local directory, as there. With `write_to_disk=False` it ships nothing
    and creates nothing, as tensorboardX writes nothing."""

    def __init__(
        self,
        logdir: str | os.PathLike[str] | None = None,
        comment: str | None = "",
        purge_step: int | None = None,
        max_queue: int | None = 10,
        flush_secs: int | None = 120,
        filename_suffix: str | None = "",
        write_to_disk: bool | None = True,
        log_dir: str | os.PathLike[str] | None = None,
        comet_config: Mapping[str, Any] | None = _COMET_OFF,
        **kwargs: Any,
    ) -> None:
        self.write_to_disk = bool(write_to_disk)  # read by the first sender the constructor makes
        if log_dir is not None and logdir is None:
            logdir = log_dir
        super().__init__(
            logdir or _default_dir(comment or ""),
            purge_step,
            "tensorboardX",
            max_queue=10 if max_queue is None else max_queue,
            flush_secs=120 if flush_secs is None else flush_secs,
            filename_suffix=filename_suffix or "",
        )
        self._tbx_init(self.log_dir)
        self._comet_config = comet_config
        self.kwargs = kwargs


class TensorboardXFileWriter(TensorboardXFileWriterMethods, PatchedWriter):
    """`tensorboardX.FileWriter`, logging through summaryd."""

    def __init__(
        self, logdir: str | os.PathLike[str], max_queue: int = 10, flush_secs: int = 120, filename_suffix: str = ""
    ) -> None:
        super().__init__(
            logdir, None, "tensorboardX", max_queue=max_queue, flush_secs=flush_secs, filename_suffix=filename_suffix
        )
        self.logdir = self.log_dir


# Module → the names replaced in it. A package re-exports from its `writer` module; both are patched.
_REPLACEMENTS: dict[str, dict[str, type[PatchedWriter]]] = {
    "torch.utils.tensorboard": {"SummaryWriter": TorchSummaryWriter, "FileWriter": TorchFileWriter},
    "torch.utils.tensorboard.writer": {"SummaryWriter": TorchSummaryWriter, "FileWriter": TorchFileWriter},
    "tensorboardX": {"SummaryWriter": TensorboardXSummaryWriter, "FileWriter": TensorboardXFileWriter},
    "tensorboardX.writer": {"SummaryWriter": TensorboardXSummaryWriter, "FileWriter": TensorboardXFileWriter},
}


def _replace_in(module: ModuleType) -> None:
    for name, replacement in _REPLACEMENTS[module.__name__].items():
        if hasattr(module, name):
            setattr(module, name, replacement)


class _Loader(importlib.abc.Loader):
    """Runs the module's own loader, then replaces its writers."""

    def __init__(self, loader: importlib.abc.Loader, after: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._after(module)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds the modules to patch with the other finders, and wraps their loaders."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _REPLACEMENTS:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target) if find is not None else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, _replace_in)
                return spec
        return None


_finder = _PostImportFinder()


def patch() -> None:
    """Make `torch.utils.tensorboard` and `tensorboardX` log through summaryd in this process.

    Their `SummaryWriter` and `FileWriter` become summaryd writers taking the same arguments (so Lightning's
    `TensorBoardLogger` and Transformers' `TensorBoardCallback` log to the daemon unchanged), whether those
    modules are imported already or later. A framework's local `log_dir` maps to a run path below
    `SUMMARYD_RUN_ROOT` (see `run_path`); the daemon's address comes from `SUMMARYD_ADDRESS`. Calling it again
    does nothing more.
    """
    for name in _REPLACEMENTS:
        module = sys.modules.get(name)
        if module is not None:
            _replace_in(module)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
        # After the senders' own exit handlers (atexit runs the last registered first): a writer the framework
        # never closed reports what became of its events.
        atexit.register(_close_live)


def _close_live() -> None:
    """At exit: the writers still open, and those closed without a wait, finish under one deadline."""
    writers = [w for w in list(_live) if not w._closed]
    timeout = max((w._options.close_timeout for w in writers), default=0.0)
    timeout = max([timeout, *(s.options.close_timeout for _, senders, _ in _delivering for s in senders)])
    deadline = time.monotonic() + timeout
    for writer in writers:
        writer._close_in_background(deadline)
    while _delivering:
        run, senders, uploader = _delivering.pop(0)
        report = _merge([s.close(max(0.0, deadline - time.monotonic())) for s in senders], uploader)
        _append_report(run, report)
