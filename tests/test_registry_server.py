"""``export --mlflow`` against a real ``mlflow server`` (SQLite backend store, local artifact
root, 127.0.0.1): a PyTorch bundle registered, promoted (and refused), loaded by alias with
``check models:/...``, and served by ``mlflow models serve``, whose HTTP answers (the class,
and the logits when asked) equal onnxruntime's on the bundle's ``model.onnx``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlflow")
torch = pytest.importorskip("torch")

from search.handover.registry import Target, register_bundle  # noqa: E402
from search.handover.registry_check import check_registered  # noqa: E402
from tests.helpers import answers, served  # noqa: E402
from tests.helpers import tabular_bundle as _bundle  # noqa: E402
from tests.helpers import tabular_val as _val  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _exported(tmp_path: Path, onnx_file: tuple[Path, float], mean: float) -> Path:
    """A bundle as ``export`` leaves it: the tabular MLP of ``test_check`` with the
    confirmation's numbers in ``metrics.json``."""
    tmp_path.mkdir()
    bundle = _bundle(tmp_path, onnx_file)
    metrics = json.loads((bundle / "metrics.json").read_text())
    metrics.update(
        study="tabular",
        objective={"metric": "val_accuracy", "mode": "max"},
        chosen={"source_trial": 3, "seed": 7},
        seeds=[5, 6],
        confirmation=[
            {"source_trial": 3, "runs": 2, "failed": 0, "mean": mean, "std": 0.002}
            | {"min": mean - 0.002, "max": mean + 0.002}
        ],
        final_history=[{"val_accuracy": 0.8}, {"val_accuracy": onnx_file[1]}],
    )
    (bundle / "metrics.json").write_text(json.dumps(metrics))
    return bundle


def test_a_torch_winner_is_registered_promoted_checked_and_served(
    mlflow_server: str,
    onnx_file: tuple[Path, float],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    import mlflow
    import onnxruntime as ort

    lines: list[str] = []
    target = Target(uri=mlflow_server, model_name="tabular-mlp", promote=True)
    first = register_bundle(_exported(tmp_path / "a", onnx_file, 0.95), target, lines.append)
    second = register_bundle(_exported(tmp_path / "b", onnx_file, 0.951), target, lines.append)
    assert (first, second) == ("models:/tabular-mlp/1", "models:/tabular-mlp/2")
    console = "".join(capfd.readouterr()) + caplog.text  # MLflow's handler, or pytest's
    for chatter in ("Successfully registered", "Created version", "new experiment", "provider"):
        assert chatter not in console, console  # our lines say what was registered
    assert "champion is now version 1 of tabular-mlp (the first)" in lines
    assert any(line.startswith("champion stays at version 1") for line in lines), lines

    client = mlflow.MlflowClient(mlflow_server)
    assert client.get_model_version_by_alias("tabular-mlp", "champion").version == "1"
    assert client.get_model_version_by_alias("tabular-mlp", "challenger").version == "2"
    run = client.get_run(client.get_model_version("tabular-mlp", "1").run_id)
    assert run.data.tags["search.source_trial"] == "3"
    assert run.data.metrics["confirmed.val_accuracy.mean"] == pytest.approx(0.95)
    noted = json.loads((tmp_path / "a" / "bundle" / "metrics.json").read_text())
    assert noted["registered_model"]["uri"] == first

    checked = check_registered("models:/tabular-mlp@champion", Target(mlflow_server, "-"))
    assert checked[-1] == "OK: models:/tabular-mlp@champion reproduces the exported accuracy"
    assert "Downloading artifacts" not in "".join(capfd.readouterr())  # MLflow's progress bar

    x, _ = _val()
    expected = ort.InferenceSession(str(onnx_file[0])).run(None, {"x": x[:5]})[0]
    with served("models:/tabular-mlp@champion", mlflow_server, tmp_path) as url:
        labels, logits = answers(url, {"x": x[:5]})
    np.testing.assert_allclose(logits, expected, atol=1e-5)
    assert labels == expected.argmax(1).tolist()  # no class names declared: their numbers
