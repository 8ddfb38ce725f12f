"""A user's PyTorch export hook: one data fingerprint, and the card reports the ONNX check
(issue 35, item 4).

``run`` (one trial) and ``export`` (one config, one seed) of a PyTorch trainable written into
``tmp_path``, as a user would; then the bundle is read as a person and the registry would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, write_spec

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

USER_MODULE = """
import numpy as np
import torch

from search import train_to_end, trainable, write_inputs


def load(rows=200):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    cut = rows * 3 // 4
    return {"x_train": x[:cut], "y_train": y[:cut], "x_val": x[cut:], "y_val": y[cut:]}


@trainable(defaults={"lr": 0.1})
def train(config, data, ctx):
    torch.manual_seed(ctx.seed)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    x, y = torch.tensor(np.array(data["x_train"])), torch.tensor(np.array(data["y_train"]))
    xv, yv = torch.tensor(np.array(data["x_val"])), torch.tensor(np.array(data["y_val"]))
    for _ in range(ctx.start_epoch, ctx.max_epochs + 1):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        with torch.no_grad():
            accuracy = (model(xv).argmax(1) == yv).float().mean().item()
        yield {"val_accuracy": accuracy}
    return model


@train.exporter
def export(config, data, ctx, out_dir):
    trained = train_to_end(train, config, data, ctx)
    out_dir.mkdir(parents=True, exist_ok=True)
    example = torch.tensor(np.array(data["x_val"][:2]))
    torch.onnx.export(
        trained.model.eval(), (example,), str(out_dir / "model.onnx"), input_names=["x"],
        output_names=["logits"], dynamic_axes={"x": {0: "batch"}}, dynamo=False,
    )
    write_inputs(out_dir, {"x": data["x_val"][:2]}, validation=(data["x_val"], data["y_val"]))
    return trained.metrics
"""


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    return subprocess.run(
        [sys.executable, "-m", "search", *args, "--results", str(tmp_path / "results")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.usefixtures("joins_session_ray")
def test_a_pytorch_hooks_bundle_has_one_fingerprint_and_its_card_reports_the_onnx_check(
    tmp_path: Path,
) -> None:
    (tmp_path / "torch_user.py").write_text(USER_MODULE)
    storage = f"sqlite:///{tmp_path}/optuna.db"
    spec = write_spec(
        tmp_path / "s.yaml",
        {
            "study": "lineage",
            "trainable": "torch_user:train",
            "data": {"loader": "torch_user:load", "args": {"rows": 200}},
            "objective": {"metric": "val_accuracy", "mode": "max"},
            "budget": {"trials": 1, "max_epochs": 3},
            "sampler": {"name": "random", "seed": 0},
            "storage": storage,
            "space": {"lr": {"uniform": [0.05, 0.5]}},
        },
    )
    run = _cli(tmp_path, "run", str(spec))
    assert run.returncode == 0, run.stderr[-3000:]
    out = tmp_path / "bundle"
    export = _cli(
        tmp_path, "export", "lineage", "--storage", storage, "--top-k", "1", "--seeds", "1",
        "--out", str(out),
    )  # fmt: skip
    assert export.returncode == 0, export.stderr[-3000:]

    card = (out / "MODEL_CARD.md").read_text()
    onnx_line = next(line for line in card.splitlines() if line.startswith("- `model.onnx`"))
    assert "export ran `python -m search check` on it: `val_accuracy " in onnx_line
    assert onnx_line.endswith("OK: model.onnx reproduces the exported validation accuracy.")
    assert "compared with the training framework: not checked" not in card

    metrics = json.loads((out / "metrics.json").read_text())
    fingerprint = metrics["data_fingerprint"]
    assert re.fullmatch(
        r"sha256:[0-9a-f]{64} \(x_train, y_train, x_val, y_val as loaded: names, dtypes, "
        r"shapes and bytes\)",
        fingerprint,
    )
    environment = (out / "environment.txt").read_text().splitlines()
    assert f"data fingerprint {fingerprint}" in environment
    assert f"Data fingerprint: `{fingerprint}`" in card

    from search.handover.registry import TAG, _lineage

    config = yaml.safe_load((out / "config.yaml").read_text())
    assert _lineage(out, metrics, config)[TAG + "data_fingerprint"] == fingerprint
