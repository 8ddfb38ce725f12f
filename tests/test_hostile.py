"""The record holds whatever a user's trainable yields: one real study, one trial per mistake.

Through a real local Ray with ASHA on (whose scheduler needs a number in every result): every
trial ends COMPLETE or FAIL with the true reason, the study goes on, and nothing raises.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from search.record.study import load_study
from search.specs.schema import parse_spec
from search.testing import HOSTILE_MODES
from search.tuning.runner import RunOptions, run_study
from tests.helpers import base_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]

EXPECTED = {
    "ok": ("COMPLETE", None, [0.6, 0.7, 0.8]),
    "numpy_scalars": ("COMPLETE", None, [0.6, 0.7, 0.8]),
    "numpy_nan": ("FAIL", "val_loss is nan at epoch 2", [0.6, 0.7]),
    "typo": ("FAIL", "metric val_accuracy missing at epoch 1 (got keys: accuracy, loss)", []),
    "every_other": ("FAIL", "metric val_accuracy missing at epoch 2 (got keys: val_loss)", [0.6]),
    "none": ("FAIL", "metric val_accuracy is not a number at epoch 2 (got NoneType None)", [0.6]),
    "string": ("FAIL", "metric val_accuracy is not a number at epoch 1 (got str 0.60)", []),
    "nothing": ("FAIL", "the trainable yielded no epoch", []),
    "keyerror": (
        "FAIL",
        "KeyError: 'learning_rate' (not retried: it fails the same way every time)",
        [],
    ),
    "yields_list": (
        "FAIL",
        "ConfigError: the trainable yielded a list at epoch 1; yield one dict of metrics per "
        "epoch, e.g. yield {'val_loss': 0.3} (not retried: it fails the same way every time)",
        [],
    ),
    # raised again on its retry, at the same epoch: not retried a second time
    "valueerror": (
        "FAIL",
        "ValueError: a bad batch (again on retry 1: not retried further)",
        [0.6],
    ),
}
RETRIES = {"valueerror": 1}
"""The retries of each mode retried (``faults.max_failures: 2``); the others none."""


def test_each_mistake_gets_its_true_record(ray_local: None, tmp_path: Path) -> None:
    assert set(EXPECTED) == set(HOSTILE_MODES)
    spec = parse_spec(
        base_spec(
            tmp_path,
            study="hostile",
            trainable="search.testing:hostile",
            budget={"trials": len(HOSTILE_MODES), "max_epochs": 3},
            sampler={"name": "grid", "seed": 0},
            # ASHA multiplies every result's metric; its one rung is the last epoch: it prunes none
            asha={"enabled": True, "grace_period": 3, "reduction_factor": 3},
            space={"mode": {"choice": list(HOSTILE_MODES)}},
            faults={"max_failures": 2},  # the KeyError must not be retried all the same
        )
    )
    summary = run_study(spec, RunOptions(results_dir=tmp_path / "results", progress=False))
    assert summary.trials_this_run == len(HOSTILE_MODES)
    trials = {t.params["mode"]: t for t in load_study("hostile", spec.storage).trials}
    assert set(trials) == set(HOSTILE_MODES)
    for mode, (state, reason, curve) in EXPECTED.items():
        trial = trials[mode]
        values = [trial.intermediate_values[e] for e in sorted(trial.intermediate_values)]
        assert (trial.state.name, trial.user_attrs.get("fail_reason")) == (state, reason), mode
        assert len(values) == len(curve) and all(
            math.isclose(v, c, rel_tol=1e-6) for v, c in zip(values, curve, strict=True)
        ), mode
        assert all(isinstance(v, float) for v in values)
        assert trial.user_attrs["retries"] == RETRIES.get(mode, 0), mode
    assert "KeyError" in Path(trials["keyerror"].user_attrs["traceback"]).read_text()
    metrics = trials["numpy_scalars"].user_attrs["metrics"]
    assert metrics == {"val_accuracy": pytest.approx(0.8), "val_loss": 0.25}
