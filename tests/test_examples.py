"""The five user projects under ``examples/``, end to end as a new user runs them:
``run`` (small budget), ``export`` (one config, one seed), then ``train`` of the bundle,
two examples at a time. The Keras example's export also registers its model in the session's
``mlflow server`` (tests/conftest.py), which ``mlflow models serve`` then serves."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest

from search.contract.inputs import read_inputs
from search.handover.mlflow_model import raw
from search.record.study import confirm_storage
from tests.helpers import REPO, TF_NOISE, answers, served

pytestmark = [pytest.mark.slow]

EXAMPLES = {
    # folder: (study, objective, another metric it yields, the model file its hook writes)
    "torch_mlp": ("bc-mlp", "val_loss", "val_accuracy", "model.onnx"),
    "keras_fit": ("wine-keras", "val_accuracy", "loss", "model.keras"),
    "lightning_mlp": ("bc-lightning", "val_loss", "val_accuracy", "model.onnx"),
    "csv_regression": ("diabetes-sgd", "val_rmse", "train_rmse", "model.pkl"),
    "hf_text": ("tokens-bert", "eval_loss", "eval_accuracy", "model.safetensors"),
}
NEEDS = {"keras_fit": "tensorflow", "hf_text": "transformers", "lightning_mlp": "lightning"}
"""The package an example needs beyond the core install (its test skips without it)."""
REGISTERED = {"keras_fit": "wine-keras"}
"""The examples whose export also registers the model (``--mlflow``), under this name."""

LONGEST_FIRST = ["lightning_mlp", "keras_fit", "hf_text", "torch_mlp", "csv_regression"]
"""The order the examples start in (measured here), so that two at a time end together."""


@dataclass
class Pipeline:
    """What ``run``, ``export`` and ``train`` of one example did, and where."""

    storage: str
    results: Path
    bundle: Path
    commands: dict[str, subprocess.CompletedProcess]


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "search", *args],
        cwd=REPO, text=True, capture_output=True, timeout=600, env=env,
    )  # fmt: skip


def _pipeline(example: str, folder: Path, env: dict[str, str], mlflow: str | None) -> Pipeline:
    """``run`` (a small budget), ``export`` (one config, one seed; registered in ``mlflow``
    for :data:`REGISTERED`), ``train`` of the bundle; each command only after the one before
    it succeeded."""
    study = EXAMPLES[example][0]
    done = Pipeline(f"sqlite:///{folder}/o.db", folder / "results", folder / "bundle", {})
    where = ["--storage", done.storage, "--results", str(done.results)]
    export = ["export", study, "--top-k", "1", "--seeds", "1", "--out", str(done.bundle)]
    if example in REGISTERED and mlflow:
        export += ["--mlflow", mlflow, "--model-name", REGISTERED[example]]
    steps = {
        "run": ["run", f"examples/{example}/space.yaml", "--trials", "2", "--max-epochs", "3"],
        "export": export,
        "train": ["train", str(done.bundle / "config.yaml")],
    }
    for name, args in steps.items():
        done.commands[name] = _cli(env, *args, *(where if name != "train" else []))
        if done.commands[name].returncode != 0:
            break
    return done


@pytest.fixture(scope="module")
def pipelines(
    session_ray_address: str,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> dict[str, Pipeline]:
    """Every example whose packages are installed, two at a time: each command is mostly
    its own imports on one core, so a second pipeline uses the other (2.7 min one at a
    time here). Their drivers join the session's Ray; the session's MLflow server starts
    only when an example of :data:`REGISTERED` runs and MLflow is installed."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": session_ray_address}
    ready = [e for e in LONGEST_FIRST if e not in NEEDS or importlib.util.find_spec(NEEDS[e])]
    registers = bool(importlib.util.find_spec("mlflow") and set(REGISTERED) & set(ready))
    mlflow = request.getfixturevalue("mlflow_server") if registers else None
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            e: pool.submit(_pipeline, e, tmp_path_factory.mktemp(e), env, mlflow) for e in ready
        }
        return {example: future.result() for example, future in futures.items()}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_an_example_runs_exports_and_trains_again(
    example: str, pipelines: dict[str, Pipeline]
) -> None:
    if example not in pipelines:
        pytest.skip(f"{NEEDS[example]} is not installed")
    study, objective, other, model_file = EXAMPLES[example]
    done = pipelines[example]
    run = done.commands["run"]
    assert run.returncode == 0, run.stderr[-2000:]
    trials = pd.read_csv(done.results / study / "trials.csv")
    assert (trials["state"] == "COMPLETE").any()
    assert f"metric_{other}" in trials.columns  # every metric yielded is kept
    epochs = pd.read_csv(done.results / study / "epochs.csv")
    assert {objective, other} <= set(epochs["metric"])
    page = (done.results / study / "report.html").read_text()
    assert 'id="metrics"' in page and 'id="metrics-2"' in page  # a plot per metric

    export = done.commands["export"]
    assert export.returncode == 0, export.stderr[-2000:]
    assert {model_file, "inputs.json", "config.yaml", "MODEL_CARD.md"} <= {
        p.name for p in done.bundle.iterdir()
    }
    card = (done.bundle / "MODEL_CARD.md").read_text()
    assert "digits" not in card and "NCHW" not in card and " nan" not in card

    again = done.commands["train"]
    assert again.returncode == 0, again.stderr[-2000:]
    assert "reproduces the exported" in again.stdout


def test_the_keras_examples_export_prints_no_tensorflow_start_up_lines(
    pipelines: dict[str, Pipeline],
) -> None:
    """TensorFlow's start-up lines and tf2onnx's deprecation notes stay off the console of a
    Keras export (``search.compute.quiet``), and the export still writes its ONNX model."""
    if "keras_fit" not in pipelines:
        pytest.skip("tensorflow is not installed")
    done = pipelines["keras_fit"]
    export = done.commands["export"]
    assert export.returncode == 0, export.stderr[-2000:]
    assert (done.bundle / "model.onnx").is_file()
    assert not [n for n in (*TF_NOISE, "is deprecated") if n in export.stderr], export.stderr


def test_the_keras_examples_winner_is_registered_and_served(
    pipelines: dict[str, Pipeline], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The Keras export registered its model (``models:/wine-keras/1``, alias challenger);
    ``mlflow models serve`` answers a raw row as the bundle's ONNX model does, and the
    confirmation runs are kept beside the study's results."""
    if "keras_fit" not in pipelines:
        pytest.skip("tensorflow is not installed")
    pytest.importorskip("mlflow")
    import onnxruntime as ort

    mlflow_server = request.getfixturevalue("mlflow_server")

    done = pipelines["keras_fit"]
    assert done.commands["export"].returncode == 0, done.commands["export"].stderr[-3000:]
    out = done.bundle
    assert {"model.keras", "model.onnx", "inputs.json"} <= {p.name for p in out.iterdir()}
    noted = json.loads((out / "metrics.json").read_text())
    assert noted["registered_model"]["uri"] == "models:/wine-keras/1"

    declared = read_inputs(out)
    assert declared is not None
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    with np.load(out / "validation.npz") as npz:
        x = np.asarray(npz[name], dtype=np.float32)[:5]
    expected = session.run(None, {name: x})[0]
    with served("models:/wine-keras@challenger", mlflow_server, tmp_path) as url:
        labels, logits = answers(url, {name: raw(declared.inputs[0], x)})
    np.testing.assert_allclose(logits, expected, atol=1e-5)
    best = expected.argmax(1).tolist()
    assert labels == ([declared.classes[i] for i in best] if declared.classes else best)
    confirms = confirm_storage(done.results, "wine-keras")  # beside the study's results
    assert optuna.load_study(study_name="wine-keras-confirm", storage=confirms).trials
