"""The shipped spaces: each one validates, and the RNN failure scenario fails truthfully."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from search.record.study import load_study
from search.specs.schema import load_spec, with_overrides
from search.tuning.runner import RunOptions, run_study
from tests.helpers import REPO

SPACES = sorted((REPO / "spaces").glob("*.yaml"))


@pytest.mark.parametrize("path", SPACES, ids=[p.stem for p in SPACES])
def test_every_shipped_space_validates(path: Path) -> None:
    spec = load_spec(path)
    assert spec.space and spec.budget.trials >= 1


@pytest.mark.torch
@pytest.mark.ray
@pytest.mark.slow
def test_exploding_rnn_trials_fail_at_the_epoch_the_loss_turned_nan(
    ray_local: None, tmp_path: Path
) -> None:
    spec = with_overrides(
        load_spec(REPO / "spaces" / "rnn.yaml"),
        **{
            "budget.trials": 4,
            "budget.max_epochs": 4,
            "storage": f"sqlite:///{tmp_path}/o.db",
            "sampler.name": "grid",
            "asha.enabled": False,
            "space": {
                "lr": {"choice": [30.0]},
                "clip_norm": {"choice": [0.0, 1.0]},
                "cell": {"choice": ["gru", "lstm"]},
            },
            "fixed": {"optimizer": "sgd", "batch_size": 64, "hidden": 32},
        },
    )
    run_study(spec, RunOptions(results_dir=tmp_path / "results", progress=False))
    trials = load_study(spec.study, spec.storage).trials
    assert len(trials) == 4
    for t in trials:
        if t.params["clip_norm"] == 0.0:
            assert t.state.name == "FAIL"
            epochs = t.user_attrs["epochs"]
            assert t.user_attrs["fail_reason"].endswith(f"at epoch {epochs}")
            assert sorted(t.intermediate_values) == list(range(1, epochs + 1))
            assert "nan" in t.user_attrs["fail_reason"] or "inf" in t.user_attrs["fail_reason"]
        else:
            assert t.state.name == "COMPLETE", t.user_attrs.get("fail_reason")
            assert all(math.isfinite(v) for v in t.intermediate_values.values())
