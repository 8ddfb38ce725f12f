"""``budget.gpu_hours`` on logical GPUs: the study stops at the budget, give or take one epoch
of each running trial, and the trials it cut end PRUNED with ``stopped_by: budget``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from search.specs.schema import load_spec
from tests.helpers import REPO, base_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]

EPOCH_S = 0.3
GPUS = 0.5  # each trial holds half a logical GPU: 4 run at once on 2 GPUs
BUDGET_S = 6.0  # GPU-seconds: about 20 epochs of half a GPU, of the 80 the trials would train


def test_a_gpu_hour_budget_ends_the_study_at_the_budget(tmp_path: Path) -> None:
    data = base_spec(
        tmp_path,
        study="budget",
        budget={"trials": 16, "max_epochs": 5, "gpu_hours": BUDGET_S / 3600},
        asha={"enabled": False},
        resources={"gpus_per_trial": GPUS, "cpus_per_trial": 0.5},
        fixed={"sleep": EPOCH_S},
    )
    path = tmp_path / "budget.yaml"
    path.write_text(json.dumps(data))
    env = {**os.environ, "SEARCH_NUM_GPUS": "2", "SEARCH_NUM_CPUS": "2"}
    done = subprocess.run(
        [sys.executable, "-m", "search", "run", str(path), "--results", str(tmp_path / "r")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "GPU time spent" in done.stdout and "budget reached" in done.stdout

    study = optuna.load_study(study_name="budget", storage=load_spec(path).storage)
    trials = study.get_trials()
    assert len(trials) < 16  # the budget, not the trial count, ended the study
    assert all(t.state.is_finished() for t in trials)
    spent = sum(t.user_attrs["seconds"] for t in trials) * GPUS
    trained = [t for t in trials if t.user_attrs.get("epochs")]
    epoch_s = max(t.user_attrs["seconds"] / t.user_attrs["epochs"] for t in trained)
    running_at_once = 4  # each may finish the epoch it is in when the budget is reached
    assert BUDGET_S <= spent <= BUDGET_S + running_at_once * GPUS * epoch_s
    cut = [t for t in trials if t.user_attrs.get("stopped_by") == "budget"]
    assert cut and any(t.state.name == "PRUNED" for t in cut)
    for trial in cut:  # those that trained an epoch are PRUNED, the others FAIL and say why
        if trial.user_attrs["epochs"]:
            assert trial.state.name == "PRUNED"
        else:
            assert trial.user_attrs["fail_reason"] == "ended before its first epoch (budget)"
    page = (tmp_path / "r" / "budget" / "report.html").read_text()
    assert "GPU time" in page and f"of a {BUDGET_S / 3600:.4g} h budget" in page
