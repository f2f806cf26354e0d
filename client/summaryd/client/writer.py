"""`SummaryWriter`: the `torch.utils.tensorboard.SummaryWriter` API, shipped to the summaryd daemon.

Every `add_*` call copies what the caller may change afterwards, checks what is cheap to check, stamps the
caller's wall time and hands a small closure to the background sender; the summary is built and serialized
there, so PNG, GIF and WAV encoding and histogram bucketing never run on the training step. The summaries are
torch's own when the process has imported torch (`_torch.builders()`), else `_summaries`'. The call never
blocks on the daemon.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import socket
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

from google.protobuf import text_format
from tensorboard.compat.proto.event_pb2 import Event, SessionLog, TaggedRunMetadata
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.projector.projector_config_pb2 import EmbeddingInfo, ProjectorConfig

from summaryd.client._api import _files, _summaries, _torch
from summaryd.client._environment import detect_worker
from summaryd.client._options import carried_or_made
from summaryd.client._process import _courier
from summaryd.client._sender import DeliveryReport, Sender, _encoder
from summaryd.client._sender._items import FAST_ITEM_BYTES
from summaryd.client._sender._kinds import SCALAR, SUMMARY

log = logging.getLogger("summaryd.client")

# Read once here: `add_scalar` pays for each module attribute it looks up, at every call.
_now = time.time
_SCALAR_BYTES = _encoder.SCALAR_OVERHEAD_BYTES
_KNOWN_TAGS = 4096
"""Tags a writer keeps the estimated bytes of, for `add_scalar`'s short way; a job that logs more distinct tags
takes the long way for the others."""

Scalar = Any  # a Python number, numpy scalar or one-element tensor or array
Tensor = Any  # a torch tensor, numpy array, or (where torch takes one) a Python number or list


def _builders() -> Any:
    """torch's summary builders when torch is imported, else ours (same names and signatures)."""
    return _torch.builders() or _summaries


def _event_bytes(summary: Summary, step: int, wall_time: float) -> bytes:
    data: bytes = Event(wall_time=wall_time, step=step, summary=summary).SerializeToString()
    return data


def _built_event(build: Callable[[], Summary], step: int, wall_time: float) -> bytes:
    """Runs on the sender thread: build the summary, then frame it as an event."""
    return _event_bytes(build(), step, wall_time)


def _video_summary(builders: Any, tag: str, video: Any, fps: float) -> Summary:
    if builders is not _summaries and _torch.can_encode_video():
        summary: Summary = builders.video(tag, video, fps)
        return summary
    return _summaries.video(tag, video, fps)


def _check_dataformats(array: Any, dataformats: str) -> None:
    letters = dataformats.upper()
    if len(set(letters)) != len(letters) or array.ndim != len(letters):
        raise ValueError(f"image of shape {tuple(array.shape)} does not match dataformats {dataformats!r}")


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _merge(reports: list[DeliveryReport], uploader: _files.FileUploader | None = None) -> DeliveryReport:
    dropped: dict[str, int] = {}
    for report in reports:
        for reason, count in report.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + count
    if uploader is not None and uploader.failed:
        dropped["files"] = uploader.failed
    errors = [r.error for r in reports if r.error]
    # Every sub-run spools below the same spool root; the main run's path is the one to show.
    spool_paths = [r.spool_path for r in reports if r.spool_path]
    if uploader is not None and uploader.spool_path:
        spool_paths.append(uploader.spool_path)
    return DeliveryReport(
        delivered=sum(r.delivered for r in reports),
        undelivered=sum(r.undelivered for r in reports),
        dropped=dropped,
        synced=all(r.synced for r in reports),
        error=errors[-1] if errors else None,
        spooled=sum(r.spooled for r in reports),
        spool_path=spool_paths[0] if spool_paths else None,
        files_spooled=uploader.spooled if uploader is not None else 0,
    )


# The daemon takes at most this many tag patterns per session (`OpenSessionRequest.aggregate_tags`).
MAX_AGGREGATE_PATTERNS = 64


def _aggregate_option(aggregate: bool | str | Sequence[str]) -> bool | tuple[str, ...]:
    """`SummaryWriter`'s `aggregate=`: on, off, or its tag patterns (one pattern may be given as a string)."""
    if isinstance(aggregate, bool):
        return aggregate
    patterns = (aggregate,) if isinstance(aggregate, str) else tuple(aggregate)
    if len(patterns) > MAX_AGGREGATE_PATTERNS:
        raise ValueError(f"aggregate= has {len(patterns)} tag patterns, over the limit of {MAX_AGGREGATE_PATTERNS}")
    if not all(isinstance(p, str) and p for p in patterns):
        raise ValueError("aggregate= takes True, False, or tag patterns as non-empty strings, e.g. ['loss', 'acc/*']")
    return patterns or False


def _close_dropped(senders: list[Sender], timeout: float) -> None:
    """A writer's finalizer: its senders still open deliver what they hold within `timeout`, in the background,
    then their threads end (the exit waits for them). Never waits: it may run on the training thread."""
    deadline = time.monotonic() + timeout
    for sender in senders:
        sender.begin_close(deadline)
    senders.clear()


class SummaryWriter:
    """Writes TensorBoard summaries for one run through the summaryd daemon.

    A drop-in for `torch.utils.tensorboard.SummaryWriter`: every public method with torch's arguments and
    defaults, and the same payloads (built by torch's own functions when torch is imported). `log_dir` is the
    run path under the daemon's logdir (default `<date>_<host><comment>`, like torch). In a job of several
    processes each one writes to `<log_dir>/<worker>`; the worker label comes from `worker=` or the launcher's
    environment (`RANK`, `TF_CONFIG`, `OMPI_COMM_WORLD_RANK`, `SLURM_PROCID`).

    Args:
        log_dir: run path relative to the daemon's logdir.
        address: daemon `host:port` (`host` alone: port 6065); default `SUMMARYD_ADDRESS`, else `localhost:6065`.
        worker: worker label; `""` forces a single writer even in a larger job.
        world_size: number of processes in the job (default from the environment).
        aggregate: in a job of several workers, whether the daemon reduces this writer's scalars across the
            workers (`<log_dir>/mean`, `min`, `max`, `std`, and `summaryd` with counts and straggler lag); a list
            of shell-style tag patterns (`["loss", "acc/*"]`, at most 64; a string is one) aggregates those tags
            only.
        comment: appended to the default `log_dir`, as in torch.
        purge_step: as in torch: a `SessionLog.START` at this step makes TensorBoard drop later points of an
            earlier, crashed attempt.
        max_queue, flush_secs, filename_suffix: accepted for compatibility; events are shipped within
            `linger_secs` and the daemon names the files.
        sender_options: the settings of `Sender` (token, TLS files, queue bound, batch sizes, timeouts, spool),
            made once into the `ClientOptions` every sender and uploader of this writer shares; or `options`,
            such an object made already.

    Raises:
        ValueError: a run path or worker label the daemon refuses (absolute, with `..`, under `.summaryd`, with
            control characters), or an address it cannot dial (a URL, a port outside 1..65535); the message says
            what to give.
    """

    reopens_on_use = False
    """Whether logging after `close()` reopens the writer in a new session, as torch's does (the writers that
    `summaryd run` puts in place of torch's and tensorboardX's: frameworks close their logger's writer at the end
    of `fit` and log to it again in `test`); here such events are counted as dropped ("closed")."""

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        address: str | None = None,
        *,
        worker: str | None = None,
        world_size: int | None = None,
        comment: str = "",
        purge_step: int | None = None,
        max_queue: int = 10,
        flush_secs: int = 120,
        filename_suffix: str = "",
        framework: str = "summaryd",
        aggregate: bool | str | Sequence[str] = True,
        **sender_options: Any,
    ) -> None:
        if not log_dir:
            log_dir = datetime.now().strftime("%b%d_%H-%M-%S") + "_" + socket.gethostname() + comment
        detected = detect_worker()
        self.log_dir = str(log_dir)
        # The run path the senders use; `log_dir` is what callers read (a patched torch writer shows there the
        # local directory it was given, as torch does).
        self.run = self.log_dir
        self._closed = False
        self._tag_bytes: dict[str, int] = {}  # the short `str` tags `add_scalar` met, and their estimated bytes
        self.max_queue = max_queue
        self.flush_secs = flush_secs
        self.filename_suffix = filename_suffix
        self._worker = detected.label if worker is None else worker
        self._world_size = world_size or detected.world_size
        self._framework = framework
        self._aggregate = _aggregate_option(aggregate)
        self._options = carried_or_made(sender_options.pop("options", None), address, sender_options)
        # The senders not yet closing. A writer dropped without close() (garbage collected, or at exit) has them
        # deliver the rest and end their threads; the finalizer holds them, never the writer.
        self._open: list[Sender] = []
        self._closing: dict[str, Sender] = {}  # by run: the senders a reopened writer's follow
        weakref.finalize(self, _close_dropped, self._open, self._options.close_timeout)
        self._sender = self._new_sender(self.run)
        # Import torch's builders now, on the constructing thread: a first import later, racing a fork of
        # another thread (a DataLoader worker), could leave the child holding the import lock.
        _builders()
        self._sub_senders: dict[str, Sender] = {}
        self._projector_config = ProjectorConfig()
        self._uploader: _files.FileUploader | None = None
        self.purge_step: int | None = None  # torch's attribute, None once the START is sent
        if purge_step is not None:
            start = Event(wall_time=time.time(), step=purge_step, session_log=SessionLog(status=SessionLog.START))
            self._sender.submit(start.SerializeToString())

    def _new_sender(self, run: str) -> Sender:
        sender = Sender(
            run,
            worker=self._worker,
            world_size=self._world_size,
            framework=self._framework,
            aggregate=self._aggregate,
            options=self._options,
        )
        self._open.append(sender)
        predecessor = self._closing.pop(run, None)
        if predecessor is not None:
            sender.open_after(predecessor)
        return sender

    def _sub_sender(self, name: str) -> Sender:
        """The sender of the sub-run `<log_dir>/<name>` (add_scalars, add_hparams), opened on first use."""
        run = f"{self.run.rstrip('/')}/{name}"
        sender = self._sub_senders.get(run)
        if sender is None:
            sender = self._sub_senders[run] = self._new_sender(run)
        return sender

    @property
    def sender(self) -> Sender:
        """The background sender of this writer's main run."""
        return self._sender

    @property
    def file_writer(self) -> SummaryWriter | None:
        """This writer, which has the `add_summary`/`add_event`/`get_logdir` of torch's `FileWriter` that some code
        reaches; None once closed, as torch sets it."""
        return None if self._closed else self

    @property
    def all_writers(self) -> dict[str, SummaryWriter] | None:
        """`{get_logdir(): file_writer}` as torch keeps it; None once closed."""
        return None if self._closed else {self.get_logdir(): self}

    @property
    def default_bins(self) -> list[float]:
        """torch's default histogram edges (`bins="tensorflow"`)."""
        return list(_summaries.tensorflow_bins())

    def get_logdir(self) -> str:
        """The run path this writer logs to (relative to the daemon's logdir)."""
        return self.log_dir

    # ---- transport ------------------------------------------------------------------------------------------

    def _log(
        self,
        build: Callable[[], Summary],
        global_step: int | None,
        walltime: float | None,
        nbytes: int = 96,
        sender: Sender | None = None,
    ) -> None:
        """Queue a summary that `build` makes on the sender thread; `build` must only read copies."""
        wall_time = time.time() if walltime is None else float(walltime)
        step = 0 if global_step is None else int(global_step)
        (sender or self._sender).submit(functools.partial(_built_event, build, step, wall_time), nbytes)

    def _log_scalar(
        self, tag: str, value: float, global_step: int | None, walltime: float | None, sender: Sender | None = None
    ) -> None:
        """Queue a `simple_value` scalar as a tuple of plain values; the sender thread builds the event.

        Building the protobuf here would cost the caller several µs more (several times that right after the
        thread slept, its caches cold).
        """
        if tag.__class__ is str:
            nbytes = _SCALAR_BYTES + len(tag)
            if nbytes <= FAST_ITEM_BYTES and len(self._tag_bytes) < _KNOWN_TAGS:
                self._tag_bytes[tag] = nbytes  # `add_scalar` takes its next scalars the short way
        else:
            tag = _encoder.checked_tag(tag)  # raises here, at the call, as torch's builder does
            nbytes = _SCALAR_BYTES + len(tag)
        wall_time = time.time() if walltime is None else float(walltime)
        step = 0 if global_step is None else int(global_step)
        (sender or self._sender).enqueue((SCALAR, tag, value, step, wall_time, nbytes))

    def _log_now(
        self, summary: Summary, global_step: int | None, walltime: float | None, sender: Sender | None = None
    ) -> None:
        """Queue a summary already built (cheap ones, and those whose errors torch raises to the caller)."""
        wall_time = time.time() if walltime is None else float(walltime)
        step = 0 if global_step is None else int(global_step)
        data = _event_bytes(summary, step, wall_time)
        (sender or self._sender).submit(data, len(data))

    # ---- TF FileWriter-style entry points (the hooks use these) ------------------------------------------

    def add_event(self, event: Event, step: int | None = None, walltime: float | None = None) -> None:
        """Send an `Event` as it is (its wall time defaults to now)."""
        event_copy = Event()
        event_copy.CopyFrom(event)
        if step is not None:
            event_copy.step = int(step)
        if walltime is not None or not event_copy.wall_time:
            event_copy.wall_time = time.time() if walltime is None else walltime
        data = event_copy.SerializeToString()
        self._sender.submit(data, len(data))

    def add_summary(
        self, summary: Summary | bytes, global_step: int | None = None, walltime: float | None = None
    ) -> None:
        """Send a `Summary` proto or its serialized bytes (kept as they are, not re-encoded)."""
        if not isinstance(summary, bytes):
            self._log_now(summary, global_step, walltime)
            return
        wall_time = time.time() if walltime is None else float(walltime)
        step = 0 if global_step is None else int(global_step)
        # The sender thread frames the bytes as the event's `summary` field: no parse, no re-encode.
        self._sender.enqueue((SUMMARY, summary, step, wall_time, _encoder.SUMMARY_OVERHEAD_BYTES + len(summary)))

    def add_session_log(
        self, session_log: SessionLog, global_step: int | None = None, walltime: float | None = None
    ) -> None:
        """Send a `SessionLog` (START, STOP, CHECKPOINT)."""
        event = Event(
            wall_time=time.time() if walltime is None else walltime,
            step=0 if global_step is None else int(global_step),
            session_log=session_log,
        )
        self._sender.submit(event.SerializeToString())

    # ---- scalars and tensors ------------------------------------------------------------------------------

    def add_scalar(
        self,
        tag: str,
        scalar_value: Scalar,
        global_step: int | None = None,
        walltime: float | None = None,
        new_style: bool = False,
        double_precision: bool = False,
    ) -> None:
        """Log one scalar (`new_style`: as a tensor; `double_precision`: a float64 one); the caller pays for a
        float conversion and a queue append."""
        # `x.__class__ is int` is an attribute read; `type(x)` and `int(x)` are calls, which cost this path most.
        # Each test is written so that the usual case (a float, no step type to fix, no wall time given) jumps
        # least: every bytecode run here is a tenth of what logging a scalar costs the caller.
        if scalar_value.__class__ is not float:
            scalar_value = _torch.to_float(scalar_value)
        if new_style or double_precision:
            build = functools.partial(
                _builders().scalar, tag, scalar_value, new_style=new_style, double_precision=double_precision
            )
            self._log(build, global_step, walltime)
            return
        wall_time = float(walltime) if walltime is not None else _now()
        if global_step.__class__ is not int:
            global_step = 0 if global_step is None else int(global_step)
        try:
            # A tag seen before (a short `str`): its estimated bytes. One lookup instead of its type check, its
            # `len` and the size check of the lock-free path. Any other tag goes the long way (`_log_scalar`).
            item = (SCALAR, tag, scalar_value, global_step, wall_time, self._tag_bytes[tag])
        except (KeyError, TypeError):
            self._log_scalar(tag, scalar_value, global_step, wall_time)
            return
        # `Sender.enqueue`'s lock-free append, inlined (why it is safe: `EventQueue`): its call cost this path a
        # tenth of its CPU. After the append, one comparison tells whether the sender must hear of it (no room
        # left, not accepting, a sender thread to wake).
        queue = self._sender.queue  # not kept on the writer: a forked child's sender makes its own
        inbox = queue.inbox
        inbox.append(item)
        if len(inbox) >= queue.alert:
            self._sender.appended(item, len(inbox))

    def add_scalars(
        self,
        main_tag: str,
        tag_scalar_dict: Mapping[str, Scalar],
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Log several scalars in one chart; each key goes to its own sub-run `<log_dir>/<main_tag>_<key>`, as
        torch does (in a multi-process job `<log_dir>/<main_tag>_<key>/<worker>`)."""
        walltime = time.time() if walltime is None else walltime
        for key, scalar_value in tag_scalar_dict.items():
            sender = self._sub_sender(f"{main_tag.replace('/', '_')}_{key}")
            self._log_scalar(main_tag, _torch.to_float(scalar_value), global_step, walltime, sender)

    def add_tensor(
        self, tag: str, tensor: Tensor, global_step: int | None = None, walltime: float | None = None
    ) -> None:
        """Log a whole tensor (TensorBoard's `tensor` plugin data)."""
        builders = _builders()
        data: Any = _torch.to_numpy(tensor) if builders is _summaries else _torch.tensor_copy(tensor)
        nbytes = 96 + (data.numel() * data.element_size() if _torch.is_tensor(data) else data.nbytes)
        self._log(functools.partial(builders.tensor_proto, tag, data), global_step, walltime, nbytes)

    # ---- histograms ---------------------------------------------------------------------------------------

    def add_histogram(
        self,
        tag: str,
        values: Tensor,
        global_step: int | None = None,
        bins: Any = "tensorflow",
        walltime: float | None = None,
        max_bins: int | None = None,
    ) -> None:
        """Log a histogram of `values`; the bucketing happens on the sender thread."""
        array = _torch.to_numpy(values)
        if array.size == 0:
            raise ValueError("The input has no element.")
        if isinstance(bins, str) and bins == "tensorflow":
            bins = _summaries.tensorflow_bins()
        build = functools.partial(_builders().histogram, tag, array, bins, max_bins=max_bins)
        self._log(build, global_step, walltime, 96 + array.nbytes)

    def add_histogram_raw(
        self,
        tag: str,
        min: float,  # torch's argument names
        max: float,
        num: int,
        sum: float,
        sum_squares: float,
        bucket_limits: Sequence[float],
        bucket_counts: Sequence[float],
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Log a histogram you bucketed yourself (`bucket_limits` are the right edges)."""
        if len(bucket_limits) != len(bucket_counts):
            raise ValueError("len(bucket_limits) != len(bucket_counts), see the document.")
        summary = _builders().histogram_raw(tag, min, max, num, sum, sum_squares, bucket_limits, bucket_counts)
        self._log_now(summary, global_step, walltime)

    # ---- images, figures, video, audio --------------------------------------------------------------------

    def add_image(
        self,
        tag: str,
        img_tensor: Tensor,
        global_step: int | None = None,
        walltime: float | None = None,
        dataformats: str = "CHW",
    ) -> None:
        """Log an image (float in [0, 1] or uint8); PNG encoding happens on the sender thread."""
        array = _torch.to_numpy(img_tensor)
        _check_dataformats(array, dataformats)
        build = functools.partial(_builders().image, tag, array, dataformats=dataformats)
        self._log(build, global_step, walltime, 96 + array.nbytes)

    def add_images(
        self,
        tag: str,
        img_tensor: Tensor,
        global_step: int | None = None,
        walltime: float | None = None,
        dataformats: str = "NCHW",
    ) -> None:
        """Log a batch of images as one grid image, as torch does."""
        self.add_image(tag, img_tensor, global_step, walltime, dataformats)

    def add_image_with_boxes(
        self,
        tag: str,
        img_tensor: Tensor,
        box_tensor: Tensor,
        global_step: int | None = None,
        walltime: float | None = None,
        rescale: float = 1,
        dataformats: str = "CHW",
        labels: str | Sequence[str] | None = None,
    ) -> None:
        """Log an image with red `[xmin, ymin, xmax, ymax]` boxes (and labels) drawn on it."""
        array = _torch.to_numpy(img_tensor)
        boxes = _torch.to_numpy(box_tensor)
        _check_dataformats(array, dataformats)
        if labels is not None:
            labels = [labels] if isinstance(labels, str) else list(labels)
            if len(labels) != boxes.shape[0]:
                labels = None  # as torch: labels that do not match the boxes are left out
        build = functools.partial(
            _builders().image_boxes, tag, array, boxes, rescale=rescale, dataformats=dataformats, labels=labels
        )
        self._log(build, global_step, walltime, 96 + array.nbytes)

    def add_figure(
        self,
        tag: str,
        figure: Any,
        global_step: int | None = None,
        close: bool = True,
        walltime: float | None = None,
    ) -> None:
        """Log a matplotlib figure (or a list of them, as a grid). The figure is rendered on the caller's thread
        (matplotlib is not thread-safe, and the figure may change or be closed right after); the PNG encoding
        is not."""
        pixels = _summaries.figure_to_image(figure, close)
        self.add_image(tag, pixels, global_step, walltime, dataformats="NCHW" if isinstance(figure, list) else "CHW")

    def add_video(
        self,
        tag: str,
        vid_tensor: Tensor,
        global_step: int | None = None,
        fps: float = 4,
        walltime: float | None = None,
    ) -> None:
        """Log a `(N, T, C, H, W)` video as an animated GIF, encoded on the sender thread."""
        array = _torch.to_numpy(vid_tensor)
        if array.ndim != 5:
            raise ValueError(f"a video has shape (N, T, C, H, W), got {tuple(array.shape)}")
        build = functools.partial(_video_summary, _builders(), tag, array, fps)
        self._log(build, global_step, walltime, 96 + array.nbytes)

    def add_audio(
        self,
        tag: str,
        snd_tensor: Tensor,
        global_step: int | None = None,
        sample_rate: int = 44100,
        walltime: float | None = None,
    ) -> None:
        """Log mono audio, samples in [-1, 1]; WAV encoding happens on the sender thread."""
        array = _torch.to_numpy(snd_tensor)
        if array.squeeze().ndim != 1:
            raise ValueError(f"audio must be one channel (shape [L] or [1, L]), got shape {tuple(array.shape)}")
        build = functools.partial(_builders().audio, tag, array, sample_rate=sample_rate)
        self._log(build, global_step, walltime, 96 + array.nbytes)

    def add_text(
        self, tag: str, text_string: str, global_step: int | None = None, walltime: float | None = None
    ) -> None:
        """Log Markdown text."""
        text_string = str(text_string)
        self._log(functools.partial(_builders().text, tag, text_string), global_step, walltime, 96 + len(text_string))

    # ---- graphs and embeddings ----------------------------------------------------------------------------

    def add_graph(
        self, model: Any, input_to_model: Any = None, verbose: bool = False, use_strict_trace: bool = True
    ) -> None:
        """Log a `torch.nn.Module`'s graph, traced with torch's own tracer on the caller's thread (tracing runs
        the model, which only the caller may do)."""
        graph_def, step_stats = _torch.graph(model, input_to_model, verbose, use_strict_trace)
        self.add_event(Event(graph_def=graph_def.SerializeToString()))
        metadata = TaggedRunMetadata(tag="step1", run_metadata=step_stats.SerializeToString())
        self.add_event(Event(tagged_run_metadata=metadata))

    def add_onnx_graph(self, prototxt: str) -> None:
        """Log the graph of an ONNX model file (needs torch and onnx, as torch's does)."""
        self.add_event(Event(graph_def=_torch.onnx_graph(prototxt).SerializeToString()))

    def add_embedding(
        self,
        mat: Tensor,
        metadata: Sequence[Any] | None = None,
        label_img: Tensor | None = None,
        global_step: int | None = None,
        tag: str = "default",
        metadata_header: Sequence[str] | None = None,
    ) -> None:
        """Log data for the embedding projector: torch's files (`<step %05d>/<tag>/tensors.tsv`, `metadata.tsv`,
        `sprite.png`, and the run's `projector_config.pbtxt`), uploaded beside the run's event files.

        The caller pays for copies and the config's text; the TSV and PNG encoding and the upload happen on a
        background thread. An upload that fails is counted as `dropped["files"]` by `flush()` and `close()`.
        """
        array = _torch.to_numpy(mat)
        step = 0 if global_step is None else global_step
        subdir = f"{str(step).zfill(5)}/{_files.encode_tag(tag)}"
        rows: list[Any] | None = None
        header: list[str] | None = None
        if metadata is not None:
            if array.shape[0] != len(metadata):
                raise AssertionError("#labels should equal with #data points")
            if metadata_header:
                header = [str(h) for h in metadata_header]
                rows = [[str(e) for e in row] for row in metadata]
                if len(header) != len(rows[0]):
                    raise AssertionError("len of header must be equal to the number of columns in metadata")
            else:
                rows = [str(x) for x in metadata]
        images = None
        if label_img is not None:
            images = _torch.to_numpy(label_img)
            if array.shape[0] != images.shape[0]:
                raise AssertionError("#images should equal with #data points")
        if array.ndim != 2:
            raise AssertionError("mat should be 2D, where mat.size(0) is the number of data points")
        info = EmbeddingInfo(tensor_name=f"{tag}:{str(step).zfill(5)}", tensor_path=f"{subdir}/tensors.tsv")
        if rows is not None:
            info.metadata_path = f"{subdir}/metadata.tsv"
        if images is not None:
            info.sprite.image_path = f"{subdir}/sprite.png"
            info.sprite.single_image_dim.extend([images.shape[3], images.shape[2]])
        self._projector_config.embeddings.append(info)
        # The whole config every time (as torch rewrites it): a resent or reordered upload never loses an entry.
        config = text_format.MessageToString(self._projector_config).encode()

        def encode() -> list[tuple[str, bytes]]:
            files = _files.embedding_files(subdir, array, rows, images, header)
            return [*files, ("projector_config.pbtxt", config)]

        if self._uploader is None:
            self._uploader = _files.FileUploader(self._sender)
        self._uploader.submit(encode)

    # ---- PR curves, custom scalars, meshes, hyperparameters -----------------------------------------------

    def add_pr_curve(
        self,
        tag: str,
        labels: Tensor,
        predictions: Tensor,
        global_step: int | None = None,
        num_thresholds: int = 127,
        weights: Any = None,
        walltime: float | None = None,
    ) -> None:
        """Log a precision-recall curve from binary `labels` and `predictions` in [0, 1]; computed on the sender
        thread."""
        label_array, prediction_array = _torch.to_numpy(labels), _torch.to_numpy(predictions)
        if weights is not None and not isinstance(weights, int | float):
            weights = _torch.to_numpy(weights)
        build = functools.partial(_builders().pr_curve, tag, label_array, prediction_array, num_thresholds, weights)
        self._log(build, global_step, walltime, 96 + label_array.nbytes + prediction_array.nbytes)

    def add_pr_curve_raw(
        self,
        tag: str,
        true_positive_counts: Tensor,
        false_positive_counts: Tensor,
        true_negative_counts: Tensor,
        false_negative_counts: Tensor,
        precision: Tensor,
        recall: Tensor,
        global_step: int | None = None,
        num_thresholds: int = 127,
        weights: Any = None,
        walltime: float | None = None,
    ) -> None:
        """Log a precision-recall curve from counts you computed yourself."""
        columns = [
            _torch.to_numpy(c)
            for c in (
                true_positive_counts,
                false_positive_counts,
                true_negative_counts,
                false_negative_counts,
                precision,
                recall,
            )
        ]
        build = functools.partial(_builders().pr_curve_raw, tag, *columns, num_thresholds, weights)
        self._log(build, global_step, walltime, 96 + sum(c.nbytes for c in columns))

    def add_custom_scalars_multilinechart(
        self, tags: Sequence[str], category: str = "default", title: str = "untitled"
    ) -> None:
        """A custom-scalars chart with one line per tag."""
        self.add_custom_scalars({category: {title: ["Multiline", list(tags)]}})

    def add_custom_scalars_marginchart(
        self, tags: Sequence[str], category: str = "default", title: str = "untitled"
    ) -> None:
        """A custom-scalars chart of a value between a lower and an upper tag (`tags` = value, lower, upper)."""
        if len(tags) != 3:
            raise ValueError(f"Expected 3 tags, got {len(tags)}.")
        self.add_custom_scalars({category: {title: ["Margin", list(tags)]}})

    def add_custom_scalars(self, layout: Mapping[str, Mapping[str, Sequence[Any]]]) -> None:
        """The custom-scalars layout: `{category: {chart: ["Multiline" | "Margin", tags]}}`."""
        self._log_now(_builders().custom_scalars(layout), None, None)

    def add_mesh(
        self,
        tag: str,
        vertices: Tensor,
        colors: Tensor | None = None,
        faces: Tensor | None = None,
        config_dict: dict[str, Any] | None = None,
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Log a mesh or point cloud: `(B, N, 3)` vertices, optional colors and faces, a Three.js config."""
        vertex_array = _torch.to_numpy(vertices)
        color_array = None if colors is None else _torch.to_numpy(colors)
        face_array = None if faces is None else _torch.to_numpy(faces)
        build = functools.partial(
            _builders().mesh, tag, vertex_array, color_array, face_array, copy.deepcopy(config_dict)
        )
        self._log(build, global_step, walltime, 96 + 3 * vertex_array.nbytes)

    def add_hparams(
        self,
        hparam_dict: dict[str, Any],
        metric_dict: dict[str, Any],
        hparam_domain_discrete: dict[str, list[Any]] | None = None,
        run_name: str | None = None,
        global_step: int | None = None,
    ) -> None:
        """Log a set of hyperparameters and their metrics to the sub-run `<log_dir>/<run_name>` (default: the
        current time), as torch does."""
        if type(hparam_dict) is not dict or type(metric_dict) is not dict:
            raise TypeError("hparam_dict and metric_dict should be dictionary.")
        builders = _builders()
        experiment, start, end = builders.hparams(hparam_dict, metric_dict, hparam_domain_discrete)
        sender = self._sub_sender(run_name or str(time.time()))
        for summary in (experiment, start, end):
            self._log_now(summary, global_step, None, sender=sender)
        for tag, value in metric_dict.items():
            self._log(functools.partial(builders.scalar, tag, _torch.to_float(value)), global_step, None, sender=sender)

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def flush(self, timeout: float | None = None, *, durable: bool = False) -> DeliveryReport:
        """Send everything logged so far now; with `timeout` or `durable`, wait for it.

        `flush()` (what frameworks call after every logged step: Lightning's `logger.save()`, Transformers'
        `TensorBoardCallback`) returns at once, as torch's does: the events queued so far leave without waiting
        for `linger_secs`, and the report says what is known now (those on their way count as `undelivered`).
        `flush(timeout=T)` waits up to `T` seconds until the daemon has them in the run's event file and the
        projector's files are uploaded; `durable=True` waits (up to `timeout`, default `rpc_timeout`) until the
        daemon has also fsynced the file.
        """
        senders = [self._sender, *self._sub_senders.values()]
        if timeout is None and not durable:
            return _merge([s.send_now() for s in senders], self._uploader)
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._uploader is not None:
            self._uploader.wait(self._options.rpc_timeout * 2 if deadline is None else timeout)
        reports = [s.flush(_remaining(deadline), durable=durable) for s in senders]
        return _merge(reports, self._uploader)

    def close(self, timeout: float | None = None) -> DeliveryReport:
        """Deliver everything, have the daemon fsync it, and release the session; safe to call twice.

        Returns within about `timeout` seconds (default the sender's `close_timeout`), the runs of `add_scalars`
        and `add_hparams` under the same deadline; the report says how many events could not be delivered.
        Pending projector uploads are finished first (within the timeout).
        """
        deadline = time.monotonic() + (self._options.close_timeout if timeout is None else timeout)
        senders = self._begin_close(deadline)
        reports = [s.close(max(0.0, deadline - time.monotonic())) for s in senders]
        # What children forked with this writer logged through it, delivered by this process's courier.
        reports.append(_courier.courier.settle(self._owns_run, max(0.0, deadline - time.monotonic())))
        return _merge(reports, self._uploader)

    def _begin_close(self, deadline: float) -> list[Sender]:
        """Stop taking events and have every sender deliver the rest in the background by `deadline` (projector
        uploads are finished first, within it); the senders, for `close()` to wait for."""
        self._closed = True
        main, subs = self._sender, dict(self._sub_senders)
        if self._uploader is None:  # closed from the start: a later add_embedding is counted, not sent
            self._uploader = _files.FileUploader(self._sender)
        self._uploader.close(max(0.0, deadline - time.monotonic()))
        senders = [main, *subs.values()]
        for sender in senders:  # all at once: a writer's runs share one deadline
            sender.begin_close(deadline)
        self._open.clear()  # kept by `_process` until they are closed
        if self.reopens_on_use:
            # The closed senders hand each later event on to a reopened writer's, so that the caller's hot path
            # has no check of its own.
            main.hand_over_after_close(functools.partial(self._reopened, None))
            for run, sender in subs.items():
                sender.hand_over_after_close(functools.partial(self._reopened, run))
        return senders

    def _owns_run(self, run: str) -> bool:
        """Whether `run` is this writer's main run or one of its sub-runs."""
        return run == self.run or run.startswith(self.run.rstrip("/") + "/")

    def _reopened(self, run: str | None) -> Sender:
        """The sender that takes over from a closed one of `run` (None: the main run), the writer reopened."""
        self.reopen()
        if run is None:
            return self._sender
        return self._sub_sender(run[len(self.run.rstrip("/")) + 1 :])

    def reopen(self) -> None:
        """After `close()`, log again to the same run in a new session (torch's `FileWriter.reopen`); nothing
        while the writer is open."""
        if not self._closed:
            return
        self._closing = {s.run: s for s in (self._sender, *self._sub_senders.values())}
        self._sender = self._new_sender(self.run)
        self._sub_senders = {}
        self._uploader = None
        self._closed = False

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
