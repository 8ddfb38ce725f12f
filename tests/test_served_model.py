"""The registered model a product team calls, against a real ``mlflow server``
(tests/conftest.py): raw rows in, class names out; and ``register``, which registers a checked
bundle as it is.

The bundle is a logistic regression on the breast-cancer table written as an ONNX graph (a
``Gemm``, no training framework): its export hook would have declared the features' mean and
std and the class names with ``write_inputs``; the graph takes standardized rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from search import write_inputs
from search.handover.registry import Target, register_bundle
from search.handover.registry_check import check_registered
from search.record.study import open_study, record_spec
from search.specs.schema import parse_spec
from tests.helpers import answers, base_spec, served, served_line
from tests.helpers import cli as _cli

pytest.importorskip("mlflow")
pytestmark = pytest.mark.slow

CLASSES = ["malignant", "benign"]


def _table() -> tuple[np.ndarray, np.ndarray]:
    """Every row of the breast-cancer table, raw (float32), and its labels."""
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    return x.astype(np.float32), y.astype(np.int64)


def _graph(w: np.ndarray, b: np.ndarray) -> Any:
    """``logits = x @ w + b`` as an ONNX model (input ``x``, output ``logits``)."""
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("Gemm", ["x", "w", "b"], ["logits"])
    graph = helper.make_graph(
        [node],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 30])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _bundle(folder: Path, study: str = "tumours") -> Path:
    """A bundle as ``export`` leaves it: ``model.onnx`` taking standardized rows,
    ``inputs.json`` with mean, std, classes and validation rows (standardized, as the graph
    takes them), ``metrics.json`` with the confirmation's numbers, a ``config.yaml`` whose
    trainable is importable nowhere (so nothing can train it)."""
    import onnx
    from sklearn.linear_model import LogisticRegression

    x, y = _table()
    mean, std = x.mean(0), x.std(0)
    z = (x - mean) / std
    fit = LogisticRegression(max_iter=1000).fit(z[1::4], y[1::4])
    w = (np.stack([-fit.coef_[0], fit.coef_[0]], axis=1) / 2).astype(np.float32)
    b = (np.array([-fit.intercept_[0], fit.intercept_[0]]) / 2).astype(np.float32)
    folder.mkdir(parents=True)
    onnx.save(_graph(w, b), str(folder / "model.onnx"))
    zv, yv = z[::4], y[::4]
    accuracy = float(((zv @ w + b).argmax(1) == yv).mean())
    write_inputs(
        folder, {"x": x[:2]}, {"logits": [None, 2]}, validation=(zv, yv), mean=mean, std=std,
        classes=CLASSES,
    )  # fmt: skip
    row = {"source_trial": 3, "runs": 2, "failed": 0, "mean": accuracy, "std": 0.002}
    metrics = {
        "study": study,
        "trainable": "nowhere_pkg.tabular:train",
        "objective": {"metric": "val_accuracy", "mode": "max"},
        "chosen": {"source_trial": 3, "seed": 7},
        "seeds": [5, 6],
        "confirmation": [row | {"min": accuracy - 0.002, "max": accuracy + 0.002}],
        "final": {"val_accuracy": accuracy},
        "tolerance": 0.02,
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))
    config = {"study": f"{study}-final", "trainable": "nowhere_pkg.tabular:train"}
    config["objective"] = {"metric": "val_accuracy", "mode": "max"}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    (folder / "MODEL_CARD.md").write_text(f"# {study}\n")
    return folder


def _graph_labels(folder: Path, raw: np.ndarray) -> list[str]:
    """The class names the bundle's own graph gives raw rows, standardized by hand."""
    import onnxruntime as ort

    spec = json.loads((folder / "inputs.json").read_text())["inputs"][0]
    z = ((raw - np.asarray(spec["mean"])) / np.asarray(spec["std"])).astype(np.float32)
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    return [CLASSES[i] for i in session.run(None, {"x": z})[0].argmax(1)]


@pytest.fixture(scope="module")
def registered(mlflow_server: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle, registered as ``models:/tumours/1``; the lines ``register`` printed are in
    its ``register.log``."""
    bundle = _bundle(tmp_path_factory.mktemp("served") / "bundle")
    lines: list[str] = []
    register_bundle(bundle, Target(uri=mlflow_server, model_name="tumours"), lines.append)
    (bundle.parent / "register.log").write_text("\n".join(lines))
    return bundle


def test_the_registered_model_takes_raw_rows_and_answers_class_names(
    mlflow_server: str, registered: Path
) -> None:
    import logging

    import mlflow

    mlflow.set_tracking_uri(mlflow_server)
    heard: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: heard.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("mlflow").addHandler(handler)
    try:
        model = mlflow.pyfunc.load_model("models:/tumours/1")
    finally:
        logging.getLogger("mlflow").removeHandler(handler)
    # onnxruntime's CPU provider, asked for by name: no "CUDAExecutionProvider ... unavailable"
    # on a host without a GPU (mlflow.onnx's own loader warned on every load)
    assert not [line for line in heard if "ExecutionProvider" in line], heard
    x, y = _table()
    raw = x[::4][:40]  # validation rows as a caller has them: not standardized
    answer = model.predict({"x": raw})
    assert list(answer["label"]) == _graph_labels(registered, raw)
    assert {"malignant", "benign"} == set(answer["label"])  # both classes among these rows
    probs = np.asarray(answer["probabilities"].tolist())
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-6)
    np.testing.assert_allclose(answer["probability"], probs.max(1))
    assert "logits" not in answer
    with_logits = model.predict({"x": raw[:3]}, params={"logits": True})
    assert np.asarray(with_logits["logits"].tolist()).shape == (3, 2)

    example = model.input_example  # real validation rows, raw: not zeros, not standardized
    np.testing.assert_allclose(example["x"], x[::4][:5], rtol=1e-5)

    client = mlflow.MlflowClient(mlflow_server)
    run_id = client.get_model_version("tumours", "1").run_id
    raw_graph = mlflow.artifacts.download_artifacts(
        run_id=run_id, artifact_path="bundle/model.onnx"
    )
    assert Path(raw_graph).read_bytes() == (registered / "model.onnx").read_bytes()

    lines = check_registered("models:/tumours/1", Target(mlflow_server, "-"))
    assert "raw rows in, labels out: 143 of 143 labels agree with the bundle's model.onnx" in lines
    assert lines[-1] == "OK: models:/tumours/1 reproduces the exported accuracy"


def test_mlflow_models_serve_answers_a_raw_row_with_its_class_name(
    mlflow_server: str, registered: Path, tmp_path: Path
) -> None:
    import requests

    x, _ = _table()
    raw = x[::4][:6]
    with served("models:/tumours@challenger", mlflow_server, tmp_path) as url:
        plain = requests.post(
            f"{url}/invocations", json={"inputs": {"x": raw.tolist()}}, timeout=60
        )
        labels, logits = answers(url, {"x": raw})
    assert plain.status_code == 200, plain.text
    rows = plain.json()["predictions"]
    assert [r["label"] for r in rows] == labels == _graph_labels(registered, raw)
    assert all(abs(sum(r["probabilities"]) - 1) < 1e-6 for r in rows)
    assert "logits" not in rows[0] and logits.shape == (6, 2)


def test_the_serve_line_register_prints_serves_from_a_shell_without_the_venv(
    registered: Path, tmp_path: Path
) -> None:
    """``register``'s ``serve it:`` line, pasted into a shell that has neither the venv on its
    ``PATH`` (``uvicorn: not found`` otherwise) nor ``MLFLOW_TRACKING_URI``, serves the model."""
    printed = (registered.parent / "register.log").read_text().splitlines()
    (line,) = [x.removeprefix("serve it: ") for x in printed if x.startswith("serve it: ")]
    x, _ = _table()
    with served_line(line, tmp_path) as url:
        labels, _ = answers(url, {"x": x[:3]})
    assert labels == _graph_labels(registered, x[:3])


def _versions(uri: str, name: str) -> list[Any]:
    import mlflow

    return list(mlflow.MlflowClient(uri).search_model_versions(f"name='{name}'"))


def test_register_registers_a_checked_bundle_as_it_is(mlflow_server: str, tmp_path: Path) -> None:
    bundle = _bundle(tmp_path / "bundle", study="checked")
    graph = (bundle / "model.onnx").read_bytes()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    proc = _cli("register", str(bundle), "--mlflow", mlflow_server, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "check: OK: model.onnx reproduces the exported validation accuracy" in proc.stdout
    assert "registered models:/checked/1 (challenger)" in proc.stdout
    # nothing trained: its trainable is importable nowhere, and nothing new was written
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert (bundle / "model.onnx").read_bytes() == graph
    noted = json.loads((bundle / "metrics.json").read_text())
    assert noted["registered_model"]["uri"] == "models:/checked/1"
    (version,) = _versions(mlflow_server, "checked")
    assert version.tags["search.source_trial"] == "3"


def test_register_refuses_a_bundle_that_check_rejects(mlflow_server: str, tmp_path: Path) -> None:
    bundle = _bundle(tmp_path / "bundle", study="tampered")
    metrics = json.loads((bundle / "metrics.json").read_text())
    metrics["final"]["val_accuracy"] = 0.5  # the graph no longer scores what it claims
    (bundle / "metrics.json").write_text(json.dumps(metrics))
    proc = _cli("register", str(bundle), "--mlflow", mlflow_server, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: {bundle}: check rejects it (model.onnx scores ")
    assert "nothing was registered" in proc.stderr
    assert _versions(mlflow_server, "tampered") == []


def test_export_mlflow_refuses_to_overwrite_a_bundle(mlflow_server: str, tmp_path: Path) -> None:
    spec = parse_spec(base_spec(tmp_path, study="kept", fixed={"onnx": True}))
    study = open_study(spec)
    record_spec(study, spec)
    study.add_trial(
        create_trial(
            state=TrialState.COMPLETE,
            value=0.6,
            params={"x": 0.8},
            distributions={"x": FloatDistribution(0.0, 1.0)},
            intermediate_values={1: 0.4, 2: 0.6},
            user_attrs={"epochs": 2, "seconds": 0.1, "device": "cpu"},
        )
    )
    out = tmp_path / "r" / "kept" / "export"
    out.mkdir(parents=True)
    (out / "metrics.json").write_text('{"checked": true}\n')
    args = ["export", "kept", "--storage", spec.storage, "--results", str(tmp_path / "r")]
    proc = _cli(*args, "--mlflow", mlflow_server, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert f"error: --mlflow: {out} already holds a bundle; `python -m search register" in (
        proc.stderr
    )
    assert "--overwrite retrains and replaces it" in proc.stderr
    assert (out / "metrics.json").read_text() == '{"checked": true}\n'
    assert sorted(p.name for p in (tmp_path / "r").rglob("*")) == ["export", "kept", "metrics.json"]
