"""Resume after the driver dies: nothing lost, nothing left RUNNING, the budget honoured."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from ray.tune.schedulers import TrialScheduler

from search.record.resume import INTERRUPTED, earlier_curves, recover
from search.run.scheduler import PruneReportingASHA
from tests.conftest import REPO, base_spec, write_spec


class _FakeTrial:
    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id


def _asha() -> PruneReportingASHA:
    pruned: list[str] = []
    sched = PruneReportingASHA(
        pruned.append, metric="acc", mode="max", max_t=9, grace_period=1, reduction_factor=3
    )
    sched.pruned = pruned  # type: ignore[attr-defined]
    return sched


def test_restored_rungs_prune_a_weak_newcomer_that_an_empty_asha_would_keep() -> None:
    weak = {"training_iteration": 1, "acc": 0.2}
    fresh = _asha()
    fresh.on_trial_add(None, _FakeTrial("a"))
    assert fresh.on_trial_result(None, _FakeTrial("a"), weak) == TrialScheduler.CONTINUE

    resumed = _asha()
    assert resumed.restore_rungs([{1: 0.9, 2: 0.9, 3: 0.95}, {1: 0.8}, {1: float("nan")}]) == 3
    resumed.on_trial_add(None, _FakeTrial("a"))
    assert resumed.on_trial_result(None, _FakeTrial("a"), weak) == TrialScheduler.STOP
    assert resumed.pruned == ["a"]  # type: ignore[attr-defined]


def test_recover_fails_only_trials_of_dead_local_drivers(tmp_path: Path) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/r.db", study_name="r")
    host = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    owners = {
        "dead": f"{host}:{dead.pid}",
        "alive": f"{host}:{os.getpid()}",
        "remote": "another-machine:1",
    }
    trials = {}
    for name, owner in owners.items():
        trial = study.ask()
        trial.set_user_attr("driver", owner)
        trials[name] = trial
    done = study.ask()
    done.report(0.5, 1)
    study.tell(done, 0.5)

    recovery = recover(study)
    states = {n: study.trials[t.number].state for n, t in trials.items()}
    assert states == {
        "dead": TrialState.FAIL,
        "alive": TrialState.RUNNING,
        "remote": TrialState.RUNNING,
    }
    assert study.trials[trials["dead"].number].user_attrs["fail_reason"] == INTERRUPTED
    assert recovery.interrupted == (trials["dead"].number,)
    assert recovery.counted == 1  # the interrupted one is replaced, not counted
    assert earlier_curves(study) == [{1: 0.5}]


def _run(spec: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "search",
            "run",
            str(spec),
            "--results",
            str(spec.parent / "res"),
            *extra,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


@pytest.mark.slow
def test_kill_9_mid_study_then_run_again_continues(tmp_path: Path) -> None:
    spec_data = base_spec(
        tmp_path,
        study="killed",
        budget={"trials": 8, "max_epochs": 4},
        fixed={"sleep": 0.4},
        asha={"enabled": False},
    )
    spec = write_spec(tmp_path / "s.yaml", spec_data)
    storage = spec_data["storage"]
    driver = _run(spec)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            trials = optuna.load_study(study_name="killed", storage=storage).trials
        except KeyError:
            continue
        finished = [t for t in trials if t.state.is_finished()]
        running = [t for t in trials if t.state == TrialState.RUNNING and t.intermediate_values]
        if len(finished) >= 2 and running:
            break
    else:
        pytest.fail("the study never got going")
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    before = {
        t.number: t.state for t in optuna.load_study(study_name="killed", storage=storage).trials
    }
    kept = {n for n, s in before.items() if s.is_finished()}

    again = _run(spec)
    out, _ = again.communicate(timeout=400)
    assert again.returncode == 0, out
    assert "resumed: trials" in out

    after = optuna.load_study(study_name="killed", storage=storage).trials
    assert all(t.state.is_finished() for t in after)
    assert {t.number for t in after if t.number in kept and t.state == before[t.number]} == kept
    interrupted = [t for t in after if t.user_attrs.get("fail_reason") == INTERRUPTED]
    assert interrupted and all(before[t.number] == TrialState.RUNNING for t in interrupted)
    assert len(after) - len(interrupted) == 8  # the budget, interrupted trials replaced

    restarted = _run(spec, "--restart")
    out, _ = restarted.communicate(timeout=400)
    assert restarted.returncode == 0, out
    fresh = optuna.load_study(study_name="killed", storage=storage).trials
    assert len(fresh) == 8 and all(t.state == TrialState.COMPLETE for t in fresh)
