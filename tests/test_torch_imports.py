"""What summaryd imports of torch's into a training process: torch's summary builders and graph tracer, never
the `torch.utils.tensorboard` package, whose writer imports TensorFlow when it is installed (a forked DataLoader
worker of a process holding TensorFlow's threads was seen to crash). The builders loaded apart are torch's own
files: their payloads are the package's byte for byte.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

SAME_PAYLOADS = textwrap.dedent(
    """
    import json, sys
    import numpy as np, torch
    from summaryd.client._api import _torch

    own = _torch.builders()
    seen = {"package": "torch.utils.tensorboard" in sys.modules, "tensorflow": "tensorflow" in sys.modules}

    def payloads(builders, trace):
        torch.manual_seed(0)
        summaries = [
            builders.scalar("s", 0.5),
            builders.scalar("d", 1 / 3, new_style=True, double_precision=True),
            builders.histogram("h", torch.randn(100).numpy(), 10),
            builders.image("i", torch.rand(3, 4, 4), dataformats="CHW"),
            builders.text("t", "hello"),
            *builders.hparams({"lr": 0.1, "opt": "adam"}, {"m": 1.0}),
            builders.pr_curve("p", np.array([0, 1, 1]), np.array([0.2, 0.8, 0.6]), 127),
        ]
        graph, _ = trace(torch.nn.Linear(2, 1), torch.zeros(1, 2), False, False)
        return [s.SerializeToString().hex() for s in (*summaries, graph)]

    mine = payloads(own, _torch.graph)
    import torch.utils.tensorboard.summary as theirs
    from torch.utils.tensorboard._pytorch_graph import graph

    seen["same"] = mine == payloads(theirs, graph)
    seen["theirs_now"] = _torch.builders() is theirs  # once the process imported torch's, it is torch's
    print(json.dumps(seen))
    """
)


def run_python(script: str) -> dict[str, bool]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, bool] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_torchs_builders_are_loaded_without_its_tensorboard_package_and_build_the_same_bytes() -> None:
    seen = run_python(SAME_PAYLOADS)
    assert seen == {"package": False, "tensorflow": False, "same": True, "theirs_now": True}


EVERY_KIND = textwrap.dedent(
    """
    import json, sys
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np, torch
    from torch.utils.data import DataLoader
    from summaryd.client import SummaryWriter

    w = SummaryWriter("no-tf", address="127.0.0.1:1", close_timeout=0.1, spool=False)
    w.add_scalar("s", 0.5, 0)
    w.add_scalars("pair", {"a": 1.0, "b": 2.0}, 0)
    w.add_tensor("t", torch.arange(4.0))
    w.add_histogram("h", torch.randn(100), 0)
    w.add_image("i", torch.rand(3, 4, 4))
    w.add_images("is", torch.rand(2, 3, 4, 4))
    w.add_image_with_boxes("b", torch.rand(3, 8, 8), torch.tensor([[1, 1, 4, 4]]))
    w.add_figure("f", plt.figure())
    w.add_video("v", torch.rand(1, 2, 3, 4, 4))
    w.add_audio("a", torch.rand(100))
    w.add_text("x", "hello")
    w.add_graph(torch.nn.Linear(2, 1), torch.zeros(1, 2))
    w.add_embedding(torch.rand(5, 3), metadata=list("abcde"), label_img=torch.rand(5, 3, 4, 4))
    w.add_pr_curve("p", np.array([0, 1]), np.array([0.2, 0.8]))
    w.add_custom_scalars({"c": {"l": ["Multiline", ["s"]]}})
    w.add_mesh("m", torch.rand(1, 3, 3))
    w.add_hparams({"lr": 0.1}, {"m": 1.0})
    w.flush()
    loader = DataLoader(list(range(4)), num_workers=2, multiprocessing_context="fork")
    assert sorted(int(x) for x in loader) == [0, 1, 2, 3]
    w.close()
    print(json.dumps({"tensorflow": sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow")[:3]}))
    """
)


@pytest.mark.slow
def test_logging_every_kind_never_imports_an_installed_tensorflow() -> None:
    """The slow tier has TensorFlow installed: a torch training process logging every kind of summary, and
    forking DataLoader workers, has none of it imported."""
    assert importlib.util.find_spec("tensorflow") is not None, "the slow tier runs with TensorFlow installed"
    assert run_python(EVERY_KIND) == {"tensorflow": []}
