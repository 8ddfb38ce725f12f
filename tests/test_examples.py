"""The four user projects under ``examples/``, end to end as a new user runs them:
``run`` (small budget), ``export`` (one config, one seed), then ``train`` of the bundle."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("joins_session_ray")]

EXAMPLES = {
    # folder: (study, objective, another metric it yields, the model file its hook writes)
    "torch_mlp": ("bc-mlp", "val_loss", "val_accuracy", "model.onnx"),
    "keras_fit": ("wine-keras", "val_accuracy", "loss", "model.keras"),
    "lightning_mlp": ("bc-lightning", "val_loss", "val_accuracy", "model.onnx"),
    "csv_regression": ("diabetes-sgd", "val_rmse", "train_rmse", "model.pkl"),
    "hf_text": ("tokens-bert", "eval_loss", "eval_accuracy", "model.safetensors"),
}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "search", *args],
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_an_example_runs_exports_and_trains_again(example: str, tmp_path: Path) -> None:
    if example == "keras_fit":
        pytest.importorskip("tensorflow")
    if example == "hf_text":
        pytest.importorskip("transformers")
    if example == "lightning_mlp":
        pytest.importorskip("lightning")
    study, objective, other, model_file = EXAMPLES[example]
    storage, results = f"sqlite:///{tmp_path}/o.db", tmp_path / "results"
    spec = f"examples/{example}/space.yaml"
    run = _cli(
        "run",
        spec,
        "--trials",
        "2",
        "--max-epochs",
        "3",
        "--storage",
        storage,
        "--results",
        str(results),
    )
    assert run.returncode == 0, run.stderr[-2000:]
    trials = pd.read_csv(results / study / "trials.csv")
    assert (trials["state"] == "COMPLETE").any()
    assert f"metric_{other}" in trials.columns  # every metric yielded is kept
    epochs = pd.read_csv(results / study / "epochs.csv")
    assert {objective, other} <= set(epochs["metric"])
    page = (results / study / "report.html").read_text()
    assert 'id="metrics"' in page and 'id="metrics-2"' in page  # a plot per metric

    out = tmp_path / "bundle"
    export = _cli(
        "export",
        study,
        "--storage",
        storage,
        "--top-k",
        "1",
        "--seeds",
        "1",
        "--out",
        str(out),
        "--results",
        str(results),
    )
    assert export.returncode == 0, export.stderr[-2000:]
    assert {model_file, "inputs.json", "config.yaml", "MODEL_CARD.md"} <= {
        p.name for p in out.iterdir()
    }
    card = (out / "MODEL_CARD.md").read_text()
    assert "digits" not in card and "NCHW" not in card and " nan" not in card

    again = _cli("train", str(out / "config.yaml"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "reproduces the exported" in again.stdout
