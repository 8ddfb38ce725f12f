"""``MODEL_CARD.md`` for a user's model: the declared inputs, never the built-ins' words or NaN."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from search.contract.inputs import read_inputs, write_inputs
from search.handover.card import model_card
from search.specs.schema import StudySpec, parse_spec
from tests.helpers import base_spec

USER_TRAINABLE = "tabular_user.model:train"


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A user's trainable module on the path (the spec validator finds it; the card never
    imports it)."""
    package = tmp_path / "pkg" / "tabular_user"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text("def train(config, data, ctx):\n    raise SystemExit\n")
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    return USER_TRAINABLE


def _study(spec: StudySpec) -> optuna.Study:
    study = optuna.create_study(study_name=spec.study, direction="maximize")
    study.set_user_attr("spec", spec.to_dict())
    for number, lr in enumerate((1e-3, 3e-3)):
        study.add_trial(
            create_trial(
                state=TrialState.COMPLETE,
                value=0.9 + number / 100,
                params={"lr": lr},
                distributions={"lr": FloatDistribution(1e-4, 1e-1, log=True)},
                user_attrs={"epochs": 3},
            )
        )
    return study


def _metrics(spec: StudySpec, final: dict[str, Any]) -> dict[str, Any]:
    row = {
        "source_trial": 1,
        "search_value": 0.91,
        "mean": 0.95,
        "std": 0.01,
        "min": 0.94,
        "max": 0.96,
        "runs": 2,
        "failed": 0,
        "values": {"101": 0.94, "102": 0.96},
        "params": {"lr": 3e-3},
    }
    return {
        "study": spec.study,
        "trainable": spec.trainable,
        "objective": {"metric": "val_accuracy", "mode": "max"},
        "confirm_study": f"{spec.study}-confirm",
        "seeds": [101, 102],
        "max_epochs": 3,
        "chosen": {"source_trial": 1, "seed": 102, "config": {"lr": 3e-3, "hidden": 16}},
        "confirmation": [row],
        "final": final,
        "tolerance": 0.02,
        "final_seed_confirmation_value": 0.96,
        "final_history": [],
        "export_seconds": 4.2,
    }


def _card(tmp_path: Path, trainable: str, final: dict[str, Any], bundle: Path) -> str:
    spec = parse_spec(
        base_spec(
            tmp_path,
            study="tabular",
            trainable=trainable,
            space={"lr": {"loguniform": [1e-4, 1e-1]}},
        )
    )
    return model_card(_study(spec), spec, _metrics(spec, final), bundle)


def _user_bundle(tmp_path: Path, declare: bool = True) -> Path:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "model.onnx").write_bytes(b"stand-in: the card only sees that it exists")
    (bundle / "model.safetensors").write_bytes(b"stand-in")
    (bundle / "scaler.json").write_text("{}")
    if declare:
        write_inputs(
            bundle,
            {"x": np.zeros((2, 30), np.float32)},
            {"logits": [None, 2]},
        )
    return bundle


NAN = re.compile(r"\bnan\b", re.IGNORECASE)
FINAL = {"val_accuracy": 0.9561, "val_loss": 0.12, "epochs": 3.0, "onnx_max_abs_diff": math.nan}


def test_user_tabular_card_states_the_declared_inputs(tmp_path: Path, user_package: str) -> None:
    bundle = _user_bundle(tmp_path)
    declared = read_inputs(bundle)
    assert declared is not None
    assert json.loads((bundle / "inputs.json").read_text())["inputs"] == [
        {"name": "x", "shape": [None, 30], "dtype": "float32"}
    ]
    card = _card(tmp_path, user_package, dict(FINAL), bundle)
    assert "`x`" in card and "`[None, 30]`" in card and "float32" in card
    assert "`logits`: float32 `[None, 2]`" in card
    assert "NCHW" not in card and "NHWC" not in card
    assert "build_model" not in card and "digits: 0 to 16" not in card
    assert not NAN.search(card), [line for line in card.splitlines() if NAN.search(line)]
    assert "compared with the training framework: not checked" in card
    assert "validation accuracy with onnxruntime not checked" in card
    assert "| onnx_max_abs_diff | not checked |" in card
    assert f"A model of the trainable `{USER_TRAINABLE}`" in card
    assert "`scaler.json`" in card  # the hook's other files are listed
    assert "not declared by the export hook" not in card


def test_card_without_an_input_description_says_not_checked(
    tmp_path: Path, user_package: str
) -> None:
    bundle = _user_bundle(tmp_path, declare=False)
    card = _card(tmp_path, user_package, {"val_accuracy": 0.95}, bundle)
    assert "- inputs: not declared by the export hook (not checked)." in card
    assert "NCHW" not in card and "`input`" not in card and not NAN.search(card)


def test_card_with_a_malformed_description_says_why(tmp_path: Path, user_package: str) -> None:
    bundle = _user_bundle(tmp_path, declare=False)
    (bundle / "inputs.json").write_text('{"inputs": [{"name": "x", "shape": "thirty"}]}')
    card = _card(tmp_path, user_package, {"val_accuracy": 0.95}, bundle)
    assert "- inputs: not declared by the export hook (not checked) (inputs.json is malformed" in (
        card
    )


def test_builtin_card_keeps_its_words_and_never_writes_nan(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "model.onnx").write_bytes(b"stand-in")
    (bundle / "model.safetensors").write_bytes(b"stand-in")
    write_inputs(
        bundle,
        {"input": {"shape": [None, 1, 8, 8], "dtype": "float32", "layout": "NCHW"}},
        validation="dataset",
    )
    final = {"val_accuracy": 0.9, "onnx_val_accuracy": math.nan, "input_scale": 16.0}
    card = _card(tmp_path, "torch_cnn", final, bundle)
    assert "float32 NCHW" in card and "`build_model`" in card
    assert "`input`: float32 `[None, 1, 8, 8]`, NCHW" in card
    assert "largest absolute difference not checked (limit 1e-4)" in card
    assert "validation accuracy not checked." in card
    assert not NAN.search(card)
    assert "A `torch_cnn` model for `digits` classification" in card


def test_builtin_card_with_the_onnx_checks_prints_their_numbers(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "model.onnx").write_bytes(b"stand-in")
    final = {"val_accuracy": 0.9, "onnx_max_abs_diff": 2.5e-6, "onnx_val_accuracy": 0.9}
    card = _card(tmp_path, "torch_cnn", final, bundle)
    assert "largest absolute difference 2.50e-06 (limit 1e-4), validation accuracy 0.9000" in card
    assert "- inputs: not declared by the export hook (not checked)." in card


def test_environment_records_the_projects_commit_and_the_datas_fingerprint(
    tmp_path: Path, user_package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """environment.txt: the commit of the git checkout holding the trainable's module (or
    "not a git checkout"), the loader with its arguments, the arrays' shapes and a hash that
    changes with the data."""
    import subprocess

    from search.contract.dataset import Dataset
    from search.handover.card import environment
    from search.specs.schema import DataSpec

    for name in [m for m in sys.modules if m.split(".")[0] == "tabular_user"]:
        monkeypatch.delitem(sys.modules, name)  # an earlier test's package, elsewhere
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    data = Dataset(x, np.array([0, 1, 0, 1]), x[:2], np.array([0, 1]), 2, "rows")
    spec = DataSpec.model_validate({"loader": "tabular_user.data:load", "args": {"rows": 4}})
    text = environment(user_package, data, spec)
    assert "project git none (not a git checkout)" in text.splitlines()
    assert 'data loader tabular_user.data:load {"rows": 4}' in text
    assert "data x_train float32 (4, 3), y_train int64 (4,), x_val float32 (2, 3)" in text
    digest = re.search(
        r"^data fingerprint sha256:([0-9a-f]{64}) \(x_train, y_train, x_val, y_val as loaded: "
        r"names, dtypes, shapes and bytes\)$",
        text,
        re.M,
    )
    assert digest is not None

    root = tmp_path / "pkg"
    git = ["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "trainable"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    changed = Dataset(x + 1, data.y_train, data.x_val, data.y_val, 2, "rows")
    again = environment(user_package, changed, spec)
    assert f"project git {head.strip()} ({root.resolve()})" in again
    assert digest.group(1) not in again and "data fingerprint sha256:" in again


def test_a_loaders_dict_is_fingerprinted_like_a_dataset() -> None:
    """A loader may return a dict of arrays (the examples do): same shapes and hash."""
    from search.contract.dataset import Dataset
    from search.handover.lineage import fingerprint

    x, y = np.arange(12, dtype=np.float32).reshape(4, 3), np.array([0, 1, 0, 1])
    arrays = {"x_train": x, "y_train": y, "x_val": x[:2], "y_val": y[:2]}
    assert fingerprint(arrays) == fingerprint(Dataset(*arrays.values(), 2, "rows"))


def test_the_frameworks_imported_are_named_with_their_versions(tmp_path: Path) -> None:
    """Every training framework the process imported (tokenizers here, as a Hugging Face
    trainable does) is in environment.txt, in its package list, and in the registry's tags."""
    import importlib.metadata

    pytest.importorskip("tokenizers")
    from search.handover.card import environment
    from search.handover.lineage import frameworks
    from search.handover.registry import _lineage

    version = importlib.metadata.version("tokenizers")
    found = frameworks()
    assert f"tokenizers {version}" in found
    text = environment("search.testing:curve")
    assert f"frameworks {', '.join(found)}" in text.splitlines()
    assert f"tokenizers=={version}" in text.splitlines()
    (tmp_path / "environment.txt").write_text(text)
    metrics = {"study": "s", "chosen": {"source_trial": 0, "seed": 1}, "frameworks": found}
    tags = _lineage(tmp_path, metrics, {})
    assert tags["search.frameworks"] == ", ".join(found)
    assert f"tokenizers=={version}" in tags["search.packages"].split()
