"""TensorBoard reading the daemon answers as TensorBoard reading the daemon's files.

Every kind of summary torch's parity test writes is logged through summaryd into several runs; then a real
`tensorboard --logdir` (the Python loader, every point kept) and a real `tensorboard --grpc_data_provider` on the
daemon's board (every point kept) are asked every plugin's HTTP routes, run by run and tag by tag, and must give
the same answers: runs, tags, steps, wall times, values, and the bytes of every image, audio clip, mesh and graph.
Blob URLs differ (each data provider names its blobs its own way), so what they point to is compared instead.

Not compared: the projector, which reads the logdir's files itself and is not served by any data provider.

Slow tier: two TensorBoards and a few thousand HTTP requests.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _parity import Inputs, exercise
from _support import TensorBoard, start_daemon, stop_process, unused_port, wait_for
from summaryd.client import SummaryWriter

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    # torch.jit.trace (add_graph) is deprecated in favour of torch.export, and says so (see test_torch_parity).
    pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.*"),
    pytest.mark.filterwarnings("ignore::FutureWarning:torch.*"),
]

# Every plugin that keeps points, at full resolution, in both TensorBoards. TensorBoard's plugins ask for as many
# points as the flag says, and its own "0 keeps all" would have them ask for none: a number above every count.
PLUGINS = ["scalars", "histograms", "images", "audio", "text", "pr_curves", "mesh", "hparams", "custom_scalars"]
ALL_SAMPLES = ",".join(f"{plugin}=100000" for plugin in PLUGINS)
STEPS = 1200
HPARAMS = ["lr", "batch", "optimizer", "nesterov", "none", "dropout"]  # what `exercise` logs
METRICS = ["hparam/accuracy", "hparam/loss"]  # above the scalars plugin's default 1,000 points: full sampling shows


class Answers:
    """Every plugin's HTTP answers of one TensorBoard, by route, blobs as their bytes' digests."""

    def __init__(self, tb: TensorBoard) -> None:
        self._tb = tb
        self.found: dict[str, Any] = {}

    def get(self, path: str, **query: str) -> Any:
        answer = self._fetch(path, query)
        self.found[path + "?" + urllib.parse.urlencode(sorted(query.items()))] = answer
        return answer

    def post(self, path: str, body: dict[str, Any] | None = None, form: dict[str, str] | None = None) -> Any:
        if form is not None:
            data, content_type = urllib.parse.urlencode(form).encode(), "application/x-www-form-urlencoded"
        else:
            data, content_type = json.dumps(body).encode(), "application/json"
        request = urllib.request.Request(self._tb.url + path, data=data, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                parsed = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            parsed = f"HTTP {exc.code}"
        self.found[f"POST {path} {json.dumps(body if form is None else form, sort_keys=True)}"] = parsed
        return parsed

    def blob(self, path: str, key: str) -> None:
        """Fetch `path` (a blob's URL, which differs between the two) and keep its bytes' digest under `key`."""
        self.found[key] = self._fetch(path, {})

    def _fetch(self, path: str, query: dict[str, str]) -> Any:
        try:
            raw = self._tb.raw(path, **query)
        except urllib.error.HTTPError as exc:
            return f"HTTP {exc.code}"
        try:
            return json.loads(raw)
        except ValueError:
            return f"{len(raw)} bytes sha256 {hashlib.sha256(raw).hexdigest()}"


def crawl(tb: TensorBoard) -> dict[str, Any]:
    """Ask `tb` every route of every plugin that has data, for every run and tag it lists."""
    a = Answers(tb)
    runs = a.get("/data/runs")
    listing = a.get("/data/plugins_listing")
    a.found["/data/plugins_listing?"] = {name: p["enabled"] for name, p in listing.items() if name != "projector"}

    for plugin in ("scalars", "histograms", "distributions"):
        tags = a.get(f"/data/plugin/{plugin}/tags")
        for run, by_tag in sorted(tags.items()):
            for tag in sorted(by_tag):
                a.get(f"/data/plugin/{plugin}/{plugin}", run=run, tag=tag)

    for plugin, route, single in (("images", "images", "individualImage"), ("audio", "audio", "individualAudio")):
        tags = a.get(f"/data/plugin/{plugin}/tags")
        for run, by_tag in sorted(tags.items()):
            for tag, info in sorted(by_tag.items()):
                for sample in range(info["samples"]):
                    entries = a.get(f"/data/plugin/{plugin}/{route}", run=run, tag=tag, sample=str(sample))
                    for entry in entries:
                        query = entry.pop("query")
                        a.blob(f"/data/plugin/{plugin}/{single}?{query}", f"{plugin} {run} {tag} {sample} {entry}")

    text = a.get("/data/plugin/text/tags")
    for run, tag_list in sorted(text.items()):
        for tag in sorted(tag_list):
            a.get("/data/plugin/text/text", run=run, tag=tag)
            a.get("/data/plugin/text/text", run=run, tag=tag, markdown="false")

    curves = a.get("/data/plugin/pr_curves/tags")
    for run, by_tag in sorted(curves.items()):
        for tag in sorted(by_tag):
            a.get("/data/plugin/pr_curves/pr_curves", run=run, tag=tag)

    layout = a.get("/data/plugin/custom_scalars/layout")
    patterns = {
        tag
        for category in (layout or {}).get("category", [])
        for chart in category["chart"]
        for kind in ("multiline", "margin")
        if kind in chart
        for tag in (chart[kind].get("tag") or [s["value"] for s in chart[kind].get("series", [])])
    }
    for run in runs:
        for pattern in sorted(patterns):
            a.get("/data/plugin/custom_scalars/scalars", run=run, tag=pattern)

    a.post("/data/plugin/hparams/experiment", {"experimentName": ""})
    a.post(
        "/data/plugin/hparams/session_groups",
        {
            "experimentName": "",
            "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
            "colParams": [{"hparam": h} for h in HPARAMS] + [{"metric": {"tag": m, "group": ""}} for m in METRICS],
            "startIndex": 0,
            "sliceSize": 1000,
            "includeMetrics": True,
        },
    )
    for metric in METRICS:
        for run in runs:
            request = {"experimentName": "", "sessionName": run, "metricName": {"tag": metric, "group": ""}}
            a.post("/data/plugin/hparams/metric_evals", request)

    info = a.get("/data/plugin/graphs/info")
    for run, item in sorted(info.items()):
        if item["run_graph"]:
            a.get("/data/plugin/graphs/graph", run=run)
            a.get("/data/plugin/graphs/graph", run=run, conceptual="false", limit_attr_size="1024")
        for tag, tag_item in sorted(item["tags"].items()):
            if tag_item["op_graph"]:
                a.get("/data/plugin/graphs/graph", run=run, tag=tag)
            if tag_item["profile"]:
                a.get("/data/plugin/graphs/run_metadata", run=run, tag=tag)

    meshes = a.get("/data/plugin/mesh/tags")
    for run, by_tag in sorted(meshes.items()):
        for tag, info in sorted(by_tag.items()):
            for sample in range(info.get("samples", 1)):
                entries = a.get("/data/plugin/mesh/meshes", run=run, tag=tag, sample=str(sample))
                for entry in entries:
                    for content in ("VERTEX", "FACE", "COLOR"):  # an absent part is a 404 in both
                        a.get(
                            "/data/plugin/mesh/data",
                            run=run,
                            tag=tag,
                            sample=str(sample),
                            step=str(entry["step"]),
                            content_type=content,
                        )

    series = a.get("/data/plugin/timeseries/tags")
    requests: list[dict[str, Any]] = []
    for plugin in ("scalars", "histograms"):
        for tag in sorted({t for tags in series[plugin]["runTagInfo"].values() for t in tags}):
            requests.append({"plugin": plugin, "tag": tag})
    for tag, info in sorted(series["images"]["tagRunSampledInfo"].items()):
        for run, sampled in sorted(info.items()):
            for sample in range(sampled["maxSamplesPerStep"]):
                requests.append({"plugin": "images", "tag": tag, "run": run, "sample": sample})
    for request, answer in zip(
        requests, a.post("/data/plugin/timeseries/timeSeries", form={"requests": json.dumps(requests)}), strict=True
    ):
        if request["plugin"] == "images":
            for run, points in answer.get("runToSeries", {}).items():
                for point in points:
                    image = point.pop("imageId")
                    a.blob(
                        f"/data/plugin/timeseries/imageData?imageId={urllib.parse.quote(image)}",
                        f"timeseries image {run} {request} {point}",
                    )
    return a.found


def log_everything(address: str, tmp_path: Path) -> list[str]:
    """Log every kind of summary into a few runs (each with the runs torch's writer makes under it)."""
    inputs = Inputs(tmp_path)
    names = ["exp-a", "exp-b", "team/exp-c"]
    for i, name in enumerate(names):
        with SummaryWriter(name, address=address, worker="") as writer:
            exercise(FirstHparamsOnly(writer, first=i == 0), inputs)
            for step in range(STEPS):
                writer.add_scalar("long/loss", step / 4 + i, step)
            for step in range(30):  # more than the 10 images TensorBoard keeps by default
                writer.add_image("long/image", inputs.image_chw * (step / 30), step)
            assert writer.flush(timeout=30).ok
    return names


def test_tensorboard_answers_the_same_through_the_daemon_as_from_its_files(tmp_path: Path) -> None:
    board_address = f"127.0.0.1:{unused_port()}"
    daemon = start_daemon(tmp_path, "--board-listen", board_address, "--samples-per-plugin", ALL_SAMPLES)
    try:
        log_everything(daemon.address, tmp_path)
        (tmp_path / "from-files").mkdir()
        (tmp_path / "from-daemon").mkdir()
        (tmp_path / "from-rustboard").mkdir()
        files = TensorBoard(
            ["--logdir", str(daemon.logdir), "--load_fast=false", "--samples_per_plugin", ALL_SAMPLES],
            tmp_path / "from-files",
        )
        rust = TensorBoard(
            ["--logdir", str(daemon.logdir), "--load_fast=true", "--samples_per_plugin", ALL_SAMPLES],
            tmp_path / "from-rustboard",
        )
        try:
            provider = TensorBoard(
                ["--grpc_data_provider", board_address, "--samples_per_plugin", ALL_SAMPLES], tmp_path / "from-daemon"
            )
            try:
                compare(files, provider, rust)
            finally:
                stop_process(provider.proc, 10)
        finally:
            stop_process(files.proc, 10)
            stop_process(rust.proc, 10)
    finally:
        daemon.stop()


def settled(tb: TensorBoard) -> dict[str, Any]:
    """`tb`'s answers once it has read every file (twice the same, every run there)."""
    answers: dict[str, Any] = {}

    def loaded() -> bool:
        nonlocal answers
        before = crawl(tb)
        answers = crawl(tb)
        return before == answers and len(answers["/data/runs?"]) >= 3

    wait_for(loaded, 240, "TensorBoard to have read every file")
    return answers


# Where TensorBoard's Python loader answers by a choice of its own, the daemon chooses as RustBoard does (and
# answers as `tensorboard --logdir --load_fast=true`): of two graphs a run logs at one step the Python loader
# serves the first and RustBoard the later one (its preemption: a point at a step not above the last replaces it).
AS_RUSTBOARD = "/data/plugin/graphs/graph?run="


class FirstHparamsOnly:
    """A writer whose `add_hparams` logs the first experiment only: of several runs that each log one, the hparams
    dashboard shows the first its data provider lists, an order no TensorBoard defines (the Python loader's is
    the order it walked the directories in, RustBoard's changes from one start to the next)."""

    def __init__(self, writer: SummaryWriter, first: bool) -> None:
        self._writer = writer
        self._first = first

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)

    def add_hparams(self, *args: Any, **kwargs: Any) -> None:
        if self._first:
            self._writer.add_hparams(*args, **kwargs)
        self._first = False


def normalized(answers: dict[str, Any]) -> dict[str, Any]:
    """`answers` without what no TensorBoard orders or carries: the order of a mesh's parts (the Python loader's
    differs from one start to the next), and the double precision of the one scalar `exercise` logs as a double
    (the data provider's `ScalarData.value` is a float32, RustBoard's too)."""

    def narrow(value: Any) -> Any:
        if isinstance(value, float) and value == 1 / 3:
            return float(np.float32(value))
        if isinstance(value, list):
            return [narrow(v) for v in value]
        if isinstance(value, dict):
            return {k: narrow(v) for k, v in value.items()}
        return value

    def parts_in_order(route: str, answer: Any) -> Any:
        if route.startswith("/data/plugin/mesh/meshes?") and isinstance(answer, list):
            return sorted(answer, key=lambda part: (part["step"], part["content_type"]))
        return answer

    return {route: narrow(parts_in_order(route, answer)) for route, answer in answers.items()}


def differences(expected: dict[str, Any], actual: dict[str, Any], routes: list[str]) -> str:
    return f"{len(routes)} answers differ:\n" + "\n".join(
        f"{route}:\n  files:    {str(expected.get(route, 'not asked'))[:300]}\n"
        f"  provider: {str(actual.get(route, 'not asked'))[:300]}"
        for route in routes[:20]
    )


def compare(files: TensorBoard, provider: TensorBoard, rust: TensorBoard) -> None:
    expected, rustboard = normalized(settled(files)), normalized(settled(rust))
    actual = normalized(crawl(provider))
    as_rustboard = [route for route in actual if route.startswith(AS_RUSTBOARD)]
    assert len(as_rustboard) == 3  # the graph of each run
    routes = sorted((expected.keys() | actual.keys()) - set(as_rustboard))
    for kind in (*PLUGINS, "distributions", "graphs", "timeseries", "images ", "audio ", "timeseries image"):
        answered = [r for r in routes if kind in r and expected[r] and not str(expected[r]).startswith("HTTP")]
        assert answered, f"no {kind} data was compared"
    differing = [route for route in routes if actual.get(route) != expected.get(route)]
    assert not differing, differences(expected, actual, differing)
    differing = [route for route in as_rustboard if actual[route] != rustboard.get(route)]
    assert not differing, differences(rustboard, actual, differing)
    print(f"{len(routes)} answers as the Python loader's, {len(as_rustboard)} as RustBoard's")


def scalars_and_images(tb: TensorBoard, runs: list[str]) -> dict[str, Any]:
    """Every scalar series of `runs` and the steps of their images, as `tb`'s dashboards read them."""
    found: dict[str, Any] = {}
    tags = tb.get("/data/plugin/scalars/tags")
    images = tb.get("/data/plugin/images/tags")
    for run in runs:
        for tag in sorted(tags.get(run, {})):
            found[f"{run} {tag}"] = [p[1:] for p in tb.get("/data/plugin/scalars/scalars", run=run, tag=tag)]
        for tag in sorted(images.get(run, {})):
            entries = tb.get("/data/plugin/images/images", run=run, tag=tag, sample="0")
            found[f"{run} {tag}"] = [e["step"] for e in entries]
    return found


def test_restarts_and_sampling_are_served_as_tensorboard_serves_them_from_files(tmp_path: Path) -> None:
    board_address = f"127.0.0.1:{unused_port()}"
    daemon = start_daemon(tmp_path, "--board-listen", board_address)  # TensorBoard's default sampling
    try:
        address = daemon.address
        image = np.zeros((3, 4, 4), dtype=np.float32)
        # Resumed with torch's purge_step: the second START of the run drops its points from step 1200 on.
        with SummaryWriter("restarted", address=address, purge_step=0) as first:
            for step in range(1500):  # above the 1,000 scalars TensorBoard keeps: its sample, the newest in it
                first.add_scalar("loss", step / 4, step)
                first.add_scalar("lr", 1.0 / (step + 1), step)
            for step in range(30):  # above the 10 images it keeps
                first.add_image("sample", image + step / 30, step)
        with SummaryWriter("restarted", address=address, purge_step=1200) as resumed:
            for step in range(1200, 1600):
                resumed.add_scalar("loss", -step / 4, step)
        # A worker joining with purge_step=0 (the run's first START) takes nothing from what is there.
        with SummaryWriter("joined", address=address) as first:
            for step in range(10):
                first.add_scalar("lr", 0.5, step)
        with SummaryWriter("joined", address=address, purge_step=0) as joining:
            for step in range(10):
                joining.add_scalar("loss", step / 4, step)
        # Resumed without a START: the repeated steps give way (RustBoard's preemption, TensorBoard's default
        # loader for a local logdir; the Python loader keeps both and draws the line back).
        with SummaryWriter("preempted", address=address) as first:
            for step in range(300):
                first.add_scalar("loss", step / 4, step)
        with SummaryWriter("preempted", address=address) as resumed:
            for step in range(200, 250):
                resumed.add_scalar("loss", -step / 4, step)

        tbs = {}
        for name, flags in (
            ("python", ["--logdir", str(daemon.logdir), "--load_fast=false"]),
            ("rustboard", ["--logdir", str(daemon.logdir), "--load_fast=true"]),
            ("provider", ["--grpc_data_provider", board_address]),
        ):
            (tmp_path / name).mkdir()
            tbs[name] = TensorBoard(flags, tmp_path / name)
        try:
            runs = ["restarted", "joined", "preempted"]
            answers: dict[str, dict[str, Any]] = {}
            for name, tb in tbs.items():

                def complete(tb: TensorBoard = tb, name: str = name) -> bool:
                    answers[name] = scalars_and_images(tb, runs)
                    return len(answers[name]) == 6 and answers[name] == scalars_and_images(tb, runs)

                wait_for(complete, 240, f"{name} TensorBoard to have read every file")
        finally:
            for tb in tbs.values():
                stop_process(tb.proc, 10)
    finally:
        daemon.stop()

    python, rustboard, provider = answers["python"], answers["rustboard"], answers["provider"]
    for series in ("restarted loss", "restarted lr", "restarted sample", "joined loss", "joined lr"):
        assert provider[series] == python[series], series
    assert provider["preempted loss"] == rustboard["preempted loss"]
    # What those answers are, as TensorBoard documents them.
    loss = provider["restarted loss"]
    assert len(loss) == 1000 and loss[-1] == [1599, -1599 / 4]
    assert [s for s, _ in loss] == sorted({s for s, _ in loss})
    assert all(v == (s / 4 if s < 1200 else -s / 4) for s, v in loss)
    assert max(s for s, _ in provider["restarted lr"]) == 1199
    assert len(provider["restarted sample"]) == 10 and provider["restarted sample"][-1] == 29
    assert len(provider["joined lr"]) == 10
    assert provider["preempted loss"] == [[s, s / 4] for s in range(200)] + [[s, -s / 4] for s in range(200, 250)]
    assert python["preempted loss"] != provider["preempted loss"]  # the Python loader draws the line back
