"""A binary classifier with one output column, as users write them: one logit
(``BCEWithLogitsLoss``) or one probability after a sigmoid. With two classes declared, its
bundle is scored by ``check``, registered, checked as ``models:/...`` and answers raw rows
with its class name (before: "not checked", then ``KeyError: 'label'``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlflow")
torch = pytest.importorskip("torch")

from search import write_inputs  # noqa: E402
from search.handover.check import check_bundle  # noqa: E402
from search.handover.registry import (  # noqa: E402
    URI_VARIABLES,
    Target,
    fluent_on,
    register_bundle,
)
from search.handover.registry_check import check_registered  # noqa: E402
from tests.helpers import onnx_export, tabular_val  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.torch]

CLASSES = ["benign", "malignant"]


def _binary_model(sigmoid: bool) -> torch.nn.Module:
    """One output column, trained a little on the validation table (seeded)."""
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(30, 8), nn.ReLU(), nn.Linear(8, 1))
    x, y = (torch.from_numpy(a) for a in tabular_val())
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    for _ in range(30):
        opt.zero_grad()
        nn.functional.binary_cross_entropy_with_logits(net(x)[:, 0], y.float()).backward()
        opt.step()
    return (nn.Sequential(net, nn.Sigmoid()) if sigmoid else net).eval()


def _bundle(folder: Path, sigmoid: bool) -> tuple[Path, np.ndarray]:
    """The bundle export leaves, and the class each validation row gets from PyTorch."""
    model = _binary_model(sigmoid)
    folder.mkdir()
    onnx_export(model, folder / "model.onnx")
    x, y = tabular_val()
    with torch.no_grad():
        out = model(torch.from_numpy(x))[:, 0].numpy()
    predicted = (out > (0.5 if sigmoid else 0.0)).astype(int)
    write_inputs(folder, {"x": x[:2]}, validation=(x, y), classes=CLASSES)
    accuracy = float((predicted == y).mean())
    (folder / "metrics.json").write_text(
        json.dumps(
            {
                "final": {"val_accuracy": accuracy},
                "study": "binary",
                "objective": {"metric": "val_accuracy", "mode": "max"},
                "chosen": {"source_trial": 0, "seed": 1},
                "seeds": [1],
                "confirmation": [{"source_trial": 0, "runs": 1, "failed": 0, "mean": accuracy}],
                "final_history": [{"val_accuracy": accuracy}],
            }
        )
    )
    (folder / "config.yaml").write_text(
        "study: binary\ntrainable: nowhere_pkg.binary:train\n"
        "objective: {metric: val_accuracy, mode: max}\n"
    )
    return folder, predicted


@pytest.mark.parametrize("sigmoid", [False, True], ids=["one-logit", "sigmoid"])
def test_a_one_column_classifier_is_checked_registered_and_answers_its_class(
    tmp_path: Path, sigmoid: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    import mlflow

    for name in URI_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    bundle, predicted = _bundle(tmp_path / "bundle", sigmoid)
    lines = check_bundle(bundle)
    assert lines[-1].startswith("OK") and not [line for line in lines if "not checked" in line]
    assert any(line.startswith("val_accuracy ") for line in lines), lines

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    logged: list[str] = []
    register_bundle(bundle, Target(uri=uri, model_name="binary"), logged.append)
    checked = check_registered("models:/binary@challenger", Target(uri=uri, model_name="-"))
    assert checked[-1] == "OK: models:/binary@challenger reproduces the exported accuracy"
    assert any(f"{len(predicted)} of {len(predicted)} labels agree" in line for line in checked)
    # neither leaves its registry in the environment of the processes started next (a
    # notebook's next search, an `mlflow models serve` of another registry), nor a folder
    assert not {name for name in URI_VARIABLES if name in os.environ}
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("search-check-")]

    with fluent_on(uri):
        served = mlflow.pyfunc.load_model("models:/binary@challenger")
    x, _ = tabular_val()
    answer = served.predict({"x": x}, params={"logits": True})
    assert answer["label"].tolist() == [CLASSES[i] for i in predicted]
    probability = np.asarray(answer["probability"])
    assert ((probability >= 0.5) & (probability <= 1.0)).all()
    assert np.asarray(answer["logits"].tolist()).shape == (len(x), 1)  # the graph's own column
