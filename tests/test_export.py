"""``python -m search export`` and ``train``: confirmation, the bundle, the framework hooks.

Studies are built directly in their storage (real Optuna trials with the spec recorded as
``search run`` records it), so each test pays for the confirmation runs and the final model
only, not for a search.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

try:  # torchvision before TensorFlow: the other order segfaults in this build (triton's import)
    import torch  # noqa: F401
    import torchvision  # noqa: F401
except ImportError:
    pass

import numpy as np
import optuna
import pytest
import yaml
from optuna.trial import TrialState

from search.contract import TrialContext, declarations
from search.handover.confirm import ROLE
from search.handover.export import TOLERANCE, export_study
from search.record.study import CONFIRM_SUFFIX, confirm_storage
from search.specs.schema import load_spec, parse_spec
from tests.helpers import REPO, make_study
from tests.helpers import cli as _cli

# CLI runs join the session's Ray (tests/conftest.py)
pytestmark = [pytest.mark.usefixtures("joins_session_ray")]


# --- refusals ----------------------------------------------------------------------------------


def test_export_refuses_a_study_without_complete_trials(tmp_path: Path) -> None:
    spec, _ = make_study(tmp_path, {0.2: TrialState.PRUNED, 0.4: TrialState.FAIL})
    proc = _cli("export", "t", "--storage", spec.storage, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert proc.stderr == (
        "error: study 't' has no COMPLETE trial to export (2 trials: "
        "1 pruned, 1 failed); run more trials first\n"
    )
    assert not (tmp_path / "out").exists()


def test_export_refuses_a_trainable_without_an_export_hook(tmp_path: Path) -> None:
    spec, _ = make_study(tmp_path, {0.5: TrialState.COMPLETE}, trainable="search.testing:instant")
    with pytest.raises(Exception, match=r"has no export hook: declare one .* @instant.exporter"):
        export_study(
            "t", spec.storage, tmp_path / "out", results_dir=tmp_path, log=lambda line: None
        )


# --- the pipeline, on the synthetic curve (milliseconds a run) -----------------------------------


@pytest.mark.ray
def test_confirmation_is_recorded_apart_and_picks_the_best_mean(
    ray_local: None, tmp_path: Path
) -> None:
    values = {
        0.9: TrialState.COMPLETE,
        0.7: TrialState.COMPLETE,
        0.8: TrialState.COMPLETE,
        0.95: TrialState.PRUNED,
    }
    spec, study = make_study(tmp_path, values, budget={"trials": 8, "max_epochs": 4})
    lines: list[str] = []
    result = export_study(
        "t",
        spec.storage,
        tmp_path / "out",
        results_dir=tmp_path,
        top_k=2,
        seeds=2,
        log=lines.append,
    )
    assert [r.source_trial for r in result.rows] == [0, 2]  # top 2 of 3 COMPLETE, best first
    assert result.chosen.source_trial == 0
    expected = 0.9 * (1 - 0.5**4)
    assert result.chosen.mean == pytest.approx(expected) and result.chosen.std == 0.0
    assert len(study.trials) == len(values)  # the search study is left alone
    confirm = optuna.load_study(
        study_name="t" + CONFIRM_SUFFIX, storage=confirm_storage(tmp_path, "t")
    )
    assert len(confirm.trials) == 4 and confirm.user_attrs["source_study"] == "t"
    for t in confirm.trials:
        assert t.state == TrialState.COMPLETE
        assert t.user_attrs["role"] == ROLE and t.user_attrs["source_trial"] in (0, 2)
        assert t.user_attrs["seed"] in result.rows[0].values
        assert sorted(t.intermediate_values) == [1, 2, 3, 4]
    assert not set(result.rows[0].values) & {spec.sampler.seed + n for n in range(100)}
    bundle = tmp_path / "out"
    assert {
        "config.yaml",
        "metrics.json",
        "environment.txt",
        "MODEL_CARD.md",
        "learning_curves.png",
        "model.json",
    } <= {p.name for p in bundle.iterdir()}
    metrics = json.loads((bundle / "metrics.json").read_text())
    assert metrics["final"]["val_accuracy"] == pytest.approx(expected)
    assert [row["source_trial"] for row in metrics["confirmation"]] == [0, 2]
    card = (bundle / "MODEL_CARD.md").read_text()
    assert "| 0 **(chosen)** |" in card and "![learning curves](learning_curves.png)" in card
    assert "python " in (bundle / "environment.txt").read_text()
    assert any(line.startswith("confirm  4/4") for line in lines)
    used = ", ".join(metrics["frameworks"])  # what this process imported: torch (conftest)
    assert "torch " in used and f"the final model was trained with: {used}." in " ".join(
        card.split()
    )


@pytest.mark.ray
def test_a_confirmation_run_gets_a_trials_retries(ray_local: None, tmp_path: Path) -> None:
    """Each run fails its first attempt (a transient error): retried, it completes, and the
    retry is said and recorded; no run is missing."""
    marks = tmp_path / "marks"
    spec, _ = make_study(
        tmp_path,
        {0.9: TrialState.COMPLETE},
        fixed={"fail_once_in": str(marks)},
        faults={"max_failures": 1},
    )
    lines: list[str] = []
    result = export_study(
        "t", spec.storage, tmp_path / "out", results_dir=tmp_path, top_k=1, seeds=2,
        log=lines.append,
    )  # fmt: skip
    assert result.chosen.failed == 0 and len(result.chosen.ok) == 2, lines
    retries = [line for line in lines if line.startswith("confirm: trial 0 seed")]
    assert len(retries) == 2 and all("retry 1 of 1" in line for line in retries), lines
    confirm = optuna.load_study(
        study_name="t" + CONFIRM_SUFFIX, storage=confirm_storage(tmp_path, "t")
    )
    for t in confirm.trials:
        assert t.state == TrialState.COMPLETE and t.user_attrs["retries"] == 1
        assert t.user_attrs["retried_after"][0].startswith("RuntimeError: transient failure")
    assert not any(line.startswith("confirmed ") for line in lines)
    assert "Fewer confirmation runs" not in (tmp_path / "out" / "MODEL_CARD.md").read_text()


@pytest.mark.ray
def test_fewer_confirmed_runs_than_asked_are_said_in_a_line_and_in_the_card(
    ray_local: None, tmp_path: Path
) -> None:
    """The config of x=0.9 fails every attempt: its runs are missing, said once after the
    confirmation and in the model card; x=0.7 wins with both of its runs."""
    spec, _ = make_study(
        tmp_path,
        {0.9: TrialState.COMPLETE, 0.7: TrialState.COMPLETE},
        fixed={"raise_above": 0.8},
        faults={"max_failures": 1},
    )
    lines: list[str] = []
    result = export_study(
        "t", spec.storage, tmp_path / "out", results_dir=tmp_path, top_k=2, seeds=2,
        log=lines.append,
    )  # fmt: skip
    assert result.chosen.source_trial == 1
    said = [line for line in lines if line.startswith("confirmed ")]
    assert said == [
        "confirmed 2 of 4 runs asked for: 2 failed (trial 0 seed "
        f"{min(result.chosen.values)}: ValueError: x=0.9 is above "
        "raise_above); each run's fail_reason is in study 't-confirm'"
    ], lines
    card = (tmp_path / "out" / "MODEL_CARD.md").read_text()
    assert f"**Fewer confirmation runs than asked:** {said[0]}." in card
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["confirmation_shortfall"] == said[0]


@pytest.mark.ray
def test_config_yaml_round_trips_through_the_spec_validator(
    ray_local: None, tmp_path: Path
) -> None:
    spec, _ = make_study(
        tmp_path,
        {0.6: TrialState.COMPLETE},
        fixed={"sleep": 0.0},
        budget={"trials": 8, "max_epochs": 3},
    )
    result = export_study(
        "t",
        spec.storage,
        tmp_path / "out",
        results_dir=tmp_path,
        top_k=1,
        seeds=1,
        log=lambda line: None,
    )
    loaded = load_spec(tmp_path / "out" / "config.yaml")
    assert parse_spec(loaded.to_dict()) == loaded  # validated, and stable when re-dumped
    assert loaded.space == {} and loaded.fixed == {"sleep": 0.0, "x": 0.6}
    assert loaded.sampler.seed == result.seed and loaded.budget.max_epochs == 3
    assert loaded.trainable == "search.testing:curve" and loaded.asha.enabled is False
    raw = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())
    assert raw["study"] == "t-final"


# --- PyTorch ----------------------------------------------------------------------------------


@pytest.mark.torch
def test_torch_export_writes_safetensors_and_an_onnx_that_matches(tmp_path: Path) -> None:
    import onnxruntime as ort
    import torch
    from safetensors.torch import load_model

    from search.contract.dataset import load_digits
    from trainables.torch import cnn as torch_cnn
    from trainables.torch.data import to_tensors
    from trainables.torch.export import RawInputs

    data = load_digits(0.2, 0)
    config = {"channels": 8, "lr": 3e-3, "batch_size": 64}
    history: list[dict[str, float]] = []
    export = declarations("torch_cnn").export
    assert export is torch_cnn.export
    final = export(
        config,
        data,
        TrialContext(max_epochs=2, seed=3, num_threads=2, history=history),
        tmp_path,
    )
    assert len(history) == 2 and final["val_accuracy"] == history[-1]["val_accuracy"]
    assert final["onnx_max_abs_diff"] <= 1e-4
    # Rebuilt from the safetensors file alone, the model gives the exported accuracy...
    tensors = to_tensors(data)
    cfg = {**torch_cnn.DEFAULTS, **config}
    model = torch_cnn.build_model(cfg, tensors)
    load_model(model, str(tmp_path / "model.safetensors"))
    model.eval()
    with torch.no_grad():
        accuracy = (model(tensors.x_val).argmax(1) == tensors.y_val).float().mean().item()
    assert accuracy == pytest.approx(final["export_val_accuracy"])
    # ...and ONNX Runtime agrees with it on random inputs over the data's range (0..16).
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).uniform(0, 16, size=(64, 1, 8, 8)).astype(np.float32)
    got = session.run(None, {"input": x})[0]
    with torch.no_grad():
        expected = RawInputs(model, 16.0)(torch.from_numpy(x)).numpy()
    assert got.shape == (64, 10)
    assert np.abs(got - expected).max() <= 1e-4
    raw = session.run(None, {"input": data.x_val.astype(np.float32)})[0]
    assert float((raw.argmax(1) == data.y_val).mean()) == pytest.approx(accuracy)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.torch
def test_torch_study_exports_a_bundle_that_train_and_onnx_reproduce(
    ray_local: None, tmp_path: Path
) -> None:
    spec, _ = make_study(
        tmp_path,
        {3e-3: TrialState.COMPLETE, 1e-3: TrialState.COMPLETE},
        study="cnn",
        trainable="torch_cnn",
        budget={"trials": 4, "max_epochs": 2},
        fixed={"channels": 8, "batch_size": 64},
        space={"lr": {"loguniform": [1e-4, 1e-2]}},
        param="lr",
    )
    bundle = tmp_path / "bundle"
    result = export_study(
        "cnn", spec.storage, bundle, results_dir=tmp_path, top_k=2, seeds=1, log=lambda line: None
    )
    names = {p.name for p in bundle.iterdir()}
    assert {
        "model.safetensors",
        "model.onnx",
        "config.yaml",
        "metrics.json",
        "environment.txt",
        "MODEL_CARD.md",
        "learning_curves.png",
    } <= names
    assert result.final["onnx_max_abs_diff"] <= 1e-4
    twin = result.chosen.values[result.seed]  # the confirmation run with the final seed
    assert twin is not None and abs(result.final["val_accuracy"] - twin) <= TOLERANCE
    trained = _cli("train", str(bundle / "config.yaml"), timeout=300)
    assert trained.returncode == 0, trained.stderr
    assert "reproduces the exported val_accuracy" in trained.stdout
    checked = _cli_script("scripts/check_onnx.py", str(bundle))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "OK: model.onnx reproduces" in checked.stdout


def _cli_script(*args: str) -> Any:
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


# --- TensorFlow ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_tf_study_exports_a_keras_file_that_reloads_with_the_same_accuracy(
    ray_local: None, tmp_path: Path
) -> None:
    pytest.importorskip("tensorflow")
    spec, _ = make_study(
        tmp_path,
        {3e-3: TrialState.COMPLETE},
        study="tfcnn",
        trainable="tf_cnn",
        budget={"trials": 2, "max_epochs": 2},
        fixed={"channels": 8, "batch_size": 64},
        space={"lr": {"loguniform": [1e-4, 1e-2]}},
        param="lr",
    )
    bundle = tmp_path / "bundle"
    result = export_study(
        "tfcnn", spec.storage, bundle, results_dir=tmp_path, top_k=1, seeds=1, log=lambda line: None
    )
    assert (bundle / "model.keras").exists() and (bundle / "saved_model").is_dir()

    import keras

    from search.contract.dataset import load_digits
    from trainables.tf import data as tfdata

    reloaded = keras.models.load_model(bundle / "model.keras")
    val = tfdata.pipeline(tfdata.from_arrays(load_digits(0.2, 0)).val, 64, 2)
    _, accuracy = reloaded.evaluate(val, verbose=0)
    assert accuracy == pytest.approx(result.final["val_accuracy"], abs=1e-6)
    assert math.isclose(result.final["export_val_accuracy"], accuracy, abs_tol=1e-6)
    card = (bundle / "MODEL_CARD.md").read_text()
    assert "model.keras" in card and "saved_model/" in card
