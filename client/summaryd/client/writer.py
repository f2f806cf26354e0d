"""`SummaryWriter`: the `torch.utils.tensorboard.SummaryWriter` API, shipped to the summaryd daemon.

Every `add_*` call copies what the caller may mutate, stamps the caller's wall time and hands a small closure
to the background sender; the summary is built and serialized there. The call never blocks on the daemon.
"""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Mapping
from datetime import datetime
from types import TracebackType
from typing import Any

from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary

from summaryd.client import _summaries
from summaryd.client._environment import detect_worker
from summaryd.client._sender import DeliveryReport, EventSource, Sender

Scalar = Any  # a Python number, numpy scalar or 0-d torch tensor


def _event_bytes(summary: Summary, step: int, wall_time: float) -> bytes:
    data: bytes = Event(wall_time=wall_time, step=step, summary=summary).SerializeToString()
    return data


def _scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    return _event_bytes(_summaries.scalar(tag, value), step, wall_time)


def _merge(reports: list[DeliveryReport]) -> DeliveryReport:
    dropped: dict[str, int] = {}
    for report in reports:
        for reason, count in report.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + count
    errors = [r.error for r in reports if r.error]
    return DeliveryReport(
        delivered=sum(r.delivered for r in reports),
        undelivered=sum(r.undelivered for r in reports),
        dropped=dropped,
        synced=all(r.synced for r in reports),
        error=errors[-1] if errors else None,
    )


class SummaryWriter:
    """Writes TensorBoard summaries for one run through the summaryd daemon.

    A drop-in for `torch.utils.tensorboard.SummaryWriter`: the same `add_*` methods, `flush`, `close` and the
    context manager. `log_dir` is the run path under the daemon's logdir (default `<date>_<host><comment>`,
    like torch). In a job of several processes each one writes to `<log_dir>/<worker>`; the worker label comes
    from `worker=` or the launcher's environment (`RANK`, `TF_CONFIG`, `OMPI_COMM_WORLD_RANK`, `SLURM_PROCID`).

    Args:
        log_dir: run path relative to the daemon's logdir.
        address: daemon `host:port`; default `SUMMARYD_ADDRESS`, else `localhost:6065`.
        worker: worker label; `""` forces a single writer even in a larger job.
        world_size: number of processes in the job (default from the environment).
        comment: appended to the default `log_dir`, as in torch.
        purge_step: as in torch: a `SessionLog.START` at this step makes TensorBoard drop later points of an
            earlier, crashed attempt.
        max_queue, flush_secs, filename_suffix: accepted for compatibility; events are shipped within
            `linger_secs` and the daemon names the files.
        sender_options: passed to `Sender` (queue bound, batch sizes, timeouts).
    """

    def __init__(
        self,
        log_dir: str | None = None,
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
        **sender_options: Any,
    ) -> None:
        if not log_dir:
            log_dir = datetime.now().strftime("%b%d_%H-%M-%S") + "_" + socket.gethostname() + comment
        detected = detect_worker()
        self._log_dir = log_dir
        self._worker = detected.label if worker is None else worker
        self._world_size = world_size or detected.world_size
        self._address = address
        self._framework = framework
        self._sender_options = sender_options
        self._sender = self._new_sender(log_dir)
        self._sub_senders: dict[str, Sender] = {}
        if purge_step is not None:
            start = Event(wall_time=time.time(), step=purge_step, session_log=SessionLog(status=SessionLog.START))
            self._sender.submit(start.SerializeToString())

    def _new_sender(self, run: str) -> Sender:
        return Sender(
            run,
            address=self._address,
            worker=self._worker,
            world_size=self._world_size,
            framework=self._framework,
            **self._sender_options,
        )

    @property
    def sender(self) -> Sender:
        """The background sender of this writer's main run."""
        return self._sender

    def get_logdir(self) -> str:
        """The run path this writer logs to (relative to the daemon's logdir)."""
        return self._log_dir

    # ---- TF FileWriter-style entry points (the hooks use these) ------------------------------------------

    def add_event(self, event: Event, step: int | None = None, walltime: float | None = None) -> None:
        """Send an `Event` as it is (its wall time defaults to now)."""
        copy = Event()
        copy.CopyFrom(event)
        if step is not None:
            copy.step = int(step)
        if walltime is not None or not copy.wall_time:
            copy.wall_time = time.time() if walltime is None else walltime
        data = copy.SerializeToString()
        self._sender.submit(data, len(data))

    def add_summary(
        self, summary: Summary | bytes, global_step: int | None = None, walltime: float | None = None
    ) -> None:
        """Send a `Summary` proto or its serialized bytes (kept as they are, not re-encoded)."""
        wall_time = time.time() if walltime is None else walltime
        step = 0 if global_step is None else int(global_step)
        if isinstance(summary, bytes):
            # Event field 5 is `summary`: framing the bytes as that field avoids a parse and re-encode.
            data = Event(wall_time=wall_time, step=step).SerializeToString() + _length_delimited(5, summary)
        else:
            data = _event_bytes(summary, step, wall_time)
        self._sender.submit(data, len(data))

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

    # ---- torch SummaryWriter API -------------------------------------------------------------------------

    def _submit(self, build: EventSource, nbytes: int = 96, sender: Sender | None = None) -> None:
        (sender or self._sender).submit(build, nbytes)

    def add_scalar(
        self,
        tag: str,
        scalar_value: Scalar,
        global_step: int | None = None,
        walltime: float | None = None,
        new_style: bool = False,
        double_precision: bool = False,
    ) -> None:
        """Log one scalar; the caller pays for a float conversion and a queue append."""
        value = float(scalar_value)
        wall_time = time.time() if walltime is None else walltime
        step = 0 if global_step is None else int(global_step)
        self._submit(lambda: _event_bytes(_summaries.scalar(tag, value), step, wall_time))

    def add_scalars(
        self,
        main_tag: str,
        tag_scalar_dict: Mapping[str, Scalar],
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Log several scalars under one chart; each key goes to its own sub-run `<log_dir>/<main_tag>_<key>`,
        as torch does."""
        wall_time = time.time() if walltime is None else walltime
        step = 0 if global_step is None else int(global_step)
        for key, scalar_value in tag_scalar_dict.items():
            run = f"{self._log_dir}/{main_tag.replace('/', '_')}_{key}"
            sender = self._sub_senders.get(run)
            if sender is None:
                sender = self._sub_senders[run] = self._new_sender(run)
            self._submit(
                functools.partial(_scalar_event, main_tag, float(scalar_value), step, wall_time), sender=sender
            )

    def add_histogram(
        self,
        tag: str,
        values: Any,
        global_step: int | None = None,
        bins: Any = "tensorflow",
        walltime: float | None = None,
        max_bins: int | None = None,
    ) -> None:
        """Log a histogram; bucketing happens on the sender thread."""
        array = _summaries.to_numpy(values)
        wall_time = time.time() if walltime is None else walltime
        step = 0 if global_step is None else int(global_step)
        self._submit(lambda: _event_bytes(_summaries.histogram(tag, array, bins), step, wall_time), 96 + array.nbytes)

    def add_image(
        self,
        tag: str,
        img_tensor: Any,
        global_step: int | None = None,
        walltime: float | None = None,
        dataformats: str = "CHW",
    ) -> None:
        """Log an image (float in [0, 1] or uint8); PNG encoding happens on the sender thread."""
        array = _summaries.to_numpy(img_tensor)
        if array.ndim != len(dataformats):
            raise ValueError(f"image of shape {array.shape} does not match dataformats {dataformats!r}")
        wall_time = time.time() if walltime is None else walltime
        step = 0 if global_step is None else int(global_step)

        def build() -> bytes:
            hwc = _summaries.to_uint8(_summaries.to_hwc(array, dataformats))
            return _event_bytes(_summaries.image(tag, hwc), step, wall_time)

        self._submit(build, 96 + array.nbytes)

    def add_images(
        self,
        tag: str,
        img_tensor: Any,
        global_step: int | None = None,
        walltime: float | None = None,
        dataformats: str = "NCHW",
    ) -> None:
        """Log a batch of images as one grid image, as torch does."""
        self.add_image(tag, img_tensor, global_step, walltime, dataformats)

    def add_text(
        self, tag: str, text_string: str, global_step: int | None = None, walltime: float | None = None
    ) -> None:
        """Log Markdown text."""
        text_string = str(text_string)
        wall_time = time.time() if walltime is None else walltime
        step = 0 if global_step is None else int(global_step)
        self._submit(lambda: _event_bytes(_summaries.text(tag, text_string), step, wall_time), 96 + len(text_string))

    def add_audio(
        self,
        tag: str,
        snd_tensor: Any,
        global_step: int | None = None,
        sample_rate: int = 44100,
        walltime: float | None = None,
    ) -> None:
        """Log mono audio with samples in [-1, 1]; WAV encoding happens on the sender thread."""
        array = _summaries.to_numpy(snd_tensor)
        wall_time = time.time() if walltime is None else walltime
        step = 0 if global_step is None else int(global_step)
        self._submit(
            lambda: _event_bytes(_summaries.audio(tag, array, sample_rate), step, wall_time), 96 + array.nbytes
        )

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def flush(self, timeout: float | None = None, *, durable: bool = False) -> DeliveryReport:
        """Wait until everything logged so far is in the run's event file (with `durable`, fsynced too)."""
        senders = [self._sender, *self._sub_senders.values()]
        return _merge([s.flush(timeout, durable=durable) for s in senders])

    def close(self, timeout: float | None = None) -> DeliveryReport:
        """Deliver everything, have the daemon fsync it, and release the session; safe to call twice.

        Returns within about `timeout` seconds (default the sender's `close_timeout`); the report says how
        many events could not be delivered.
        """
        senders = [self._sender, *self._sub_senders.values()]
        if timeout is None:
            return _merge([s.close() for s in senders])
        deadline = time.monotonic() + timeout
        return _merge([s.close(max(0.0, deadline - time.monotonic())) for s in senders])

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _length_delimited(field_number: int, payload: bytes) -> bytes:
    """Protobuf wire encoding of a length-delimited field (tag, varint length, payload)."""
    out = bytearray()
    for value in ((field_number << 3) | 2, len(payload)):
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7  # noqa: PLW2901
        out.append(value)
    return bytes(out) + payload
