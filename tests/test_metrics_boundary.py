"""Side metrics at the boundary: numbers become floats, the rest is dropped and named.

A trainable may yield tensors, arrays, NumPy booleans, strings or ``None`` beside its objective.
:mod:`search.contract.driver` turns each number (one element) into a Python float and leaves
out everything else, by name, before anything reaches Ray Tune (which refuses a result holding
a PyTorch tensor); the trial records those names once, as the user attribute
``dropped_metrics``, and the console says them once. Unit tests need no Ray; the end-to-end
run is marked ``slow`` and ``ray``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from search.contract.driver import as_number, drive
from search.tuning.fate import DROPPED, EPOCH, METRIC_KEYS, TrialRecord
from tests.helpers import REPO, base_spec, write_spec

NUMBERS: list[tuple[Any, float]] = [
    (0.5, 0.5),
    (3, 3.0),
    (np.float32(0.5), 0.5),
    (np.int64(7), 7.0),
    (np.array(0.25), 0.25),
    (np.array([2.0]), 2.0),
    (np.array([[4]]), 4.0),
    (np.bool_(True), 1.0),
    (np.bool_(False), 0.0),
    (True, 1.0),
]
NOT_NUMBERS: list[Any] = [
    None,
    "0.5",
    b"1",
    [0.5],
    (0.5,),
    {"a": 1.0},
    np.zeros(2),
    np.array([]),
    np.array(["a"]),
    np.complex64(1j),
]


@pytest.mark.parametrize(("value", "number"), NUMBERS)
def test_a_number_of_one_element_becomes_a_python_float(value: Any, number: float) -> None:
    got = as_number(value)
    assert type(got) is float and got == number


@pytest.mark.parametrize("value", NOT_NUMBERS)
def test_anything_else_is_not_a_number(value: Any) -> None:
    assert as_number(value) is None


@pytest.mark.torch
def test_torch_tensors_of_one_element_are_numbers_and_vectors_are_not() -> None:
    torch = pytest.importorskip("torch")
    assert as_number(torch.tensor(0.25)) == 0.25
    assert as_number(torch.tensor([0.5])) == 0.5  # every trial FAILed on this in Tune
    assert as_number(torch.tensor([[3]])) == 3.0
    assert as_number(torch.tensor([True])) == 1.0
    assert as_number(torch.tensor([0.5], requires_grad=True)) == 0.5
    assert as_number(torch.tensor([1.0, 2.0])) is None
    assert as_number(torch.zeros(0)) is None


@pytest.mark.tf
def test_tensorflow_tensors_of_one_element_are_numbers_and_vectors_are_not() -> None:
    tf = pytest.importorskip("tensorflow")
    assert as_number(tf.constant(0.25)) == 0.25
    assert as_number(tf.constant([0.5])) == 0.5
    assert as_number(tf.constant([1.0, 2.0])) is None


def test_drive_keeps_the_numbers_and_names_what_it_dropped() -> None:
    raw = {
        "val_accuracy": np.float32(0.75),
        "flag": np.bool_(True),
        "one": np.array([2.0]),
        "note": "text",
        "items": [1, 2],
        "info": {"a": 1},
        "nothing": None,
        "vector": np.zeros(3),
    }
    [epoch] = drive(iter([raw]), max_epochs=1, metric="val_accuracy")
    assert epoch.metrics == {"val_accuracy": 0.75, "flag": 1.0, "one": 2.0}
    assert all(type(v) is float for v in epoch.metrics.values())
    assert epoch.dropped == ("info", "items", "note", "nothing", "vector")
    assert epoch.fail_reason is None


def test_a_metric_under_the_reserved_prefix_is_refused_in_one_line() -> None:
    """A trainable's ``search/epoch`` would be read as the worker's own epoch key."""
    from search.contract import ConfigError

    with pytest.raises(ConfigError, match=r"^the trainable yielded 'search/epoch' at epoch 2: "):
        list(drive(iter([{"loss": 1.0}, {"loss": 0.5, EPOCH: 7}]), max_epochs=5))


def test_an_objective_that_is_not_a_number_fails_the_epoch_and_is_not_dropped() -> None:
    [epoch] = drive(iter([{"val_accuracy": None, "note": "x"}]), 1, metric="val_accuracy")
    assert epoch.fail_reason == "metric val_accuracy is not a number at epoch 1 (got NoneType None)"
    assert epoch.dropped == ("note",) and epoch.metrics == {}


def test_the_trial_names_every_dropped_metric_once() -> None:
    record = TrialRecord("acc", max_epochs=2)
    record.add({"acc": 0.5, EPOCH: 1, METRIC_KEYS: ["acc"], DROPPED: ["note", "items"]})
    record.add({"acc": 0.6, EPOCH: 2, METRIC_KEYS: ["acc"], DROPPED: ["note", "vector"]})
    assert record.user_attrs()["dropped_metrics"] == ["items", "note", "vector"]
    clean = TrialRecord("acc", max_epochs=1)
    clean.add({"acc": 0.5, EPOCH: 1, METRIC_KEYS: ["acc"]})
    assert "dropped_metrics" not in clean.user_attrs()


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.torch
@pytest.mark.usefixtures("joins_session_ray")
def test_a_run_with_tensor_and_odd_side_metrics_completes_every_trial(tmp_path: Path) -> None:
    """Through ``python -m search run`` on the session's Ray: no retry, no FAIL."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    from search.record.study import load_study
    from search.testing import SIDE_METRICS_DROPPED

    spec = base_spec(
        tmp_path,
        study="side",
        trainable="search.testing:side_metrics",
        budget={"trials": 2, "max_epochs": 2},
        space={},  # side_metrics reads no knob: a space key would stop the run (never read)
        asha={"enabled": False},
        faults={"max_failures": 2},
    )
    path = write_spec(tmp_path / "side.yaml", spec)
    proc = subprocess.run(
        [sys.executable, "-m", "search", "run", str(path), "--results", str(tmp_path / "r")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    trials = load_study("side", spec["storage"]).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"], out[-3000:]
    for trial in trials:
        assert trial.user_attrs["retries"] == 0
        assert trial.user_attrs["dropped_metrics"] == sorted(SIDE_METRICS_DROPPED)
        metrics = trial.user_attrs["metrics"]
        assert math.isclose(metrics["val_loss"], 0.3, rel_tol=1e-6)
        assert (metrics["step_loss"], metrics["np_one"], metrics["flag"]) == (0.25, 3.0, 0.0)
    flat = " ".join(out.split())  # the console wraps long lines
    said = re.findall(r"yielded metrics that are not numbers; left out: (.*?) \(user", flat)
    assert said == [", ".join(sorted(SIDE_METRICS_DROPPED))], out[-3000:]  # once
