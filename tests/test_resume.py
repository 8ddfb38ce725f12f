"""Resume after the driver dies: nothing lost, nothing left RUNNING, the budget honoured."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from ray.tune.schedulers import TrialScheduler

from search.record.resume import FATE, INTERRUPTED, earlier_curves, fate_record, recover
from search.tuning.scheduler import PruneReportingASHA
from tests.helpers import base_spec, start_run, stored_study, write_spec

# CLI runs join the session's Ray (tests/conftest.py)
pytestmark = [pytest.mark.usefixtures("joins_session_ray")]


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


def test_recover_settles_every_open_trial_and_applies_a_decided_fate(tmp_path: Path) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/r.db", study_name="r")
    lost = study.ask()  # its driver died mid-training
    lost.report(0.3, 1)
    decided = study.ask()  # its driver died between writing the fate and telling it
    decided.report(0.7, 3)
    study._storage.set_trial_system_attr(
        decided._trial_id, FATE, fate_record(TrialState.COMPLETE, [0.7], {"epochs": 3})
    )
    done = study.ask()
    done.report(0.5, 1)
    study.tell(done, 0.5)
    study.add_trial(optuna.trial.create_trial(state=TrialState.WAITING))  # never started

    recovery = recover(study)
    trials = study.trials
    assert [t.state for t in trials] == [
        TrialState.FAIL,
        TrialState.COMPLETE,
        TrialState.COMPLETE,
        TrialState.FAIL,
    ]
    assert trials[0].user_attrs["fail_reason"] == INTERRUPTED
    assert trials[1].value == 0.7 and trials[1].user_attrs == {"epochs": 3}
    assert recovery.interrupted == (0, 3) and recovery.completed == (1,)
    assert recovery.counted == 2  # the decided one counts; the interrupted ones are replaced
    assert earlier_curves(study) == [{1: 0.3}, {3: 0.7}, {1: 0.5}]


def _run(spec: Path, *extra: str) -> subprocess.Popen[str]:
    return start_run(spec, *extra)


@pytest.mark.slow
def test_kill_9_mid_study_then_run_again_continues(tmp_path: Path) -> None:
    spec_data = base_spec(
        tmp_path,
        study="killed",
        budget={"trials": 6, "max_epochs": 3},
        fixed={"sleep": 0.4},
        asha={"enabled": False},
    )
    spec = write_spec(tmp_path / "s.yaml", spec_data)
    storage = spec_data["storage"]
    driver = _run(spec)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        time.sleep(0.5)
        stored = stored_study(storage, "killed")
        if stored is None:
            continue
        trials = stored.trials
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
    assert len(after) - len(interrupted) == 6  # the budget, interrupted trials replaced

    restarted = _run(spec, "--restart")
    out, _ = restarted.communicate(timeout=400)
    assert restarted.returncode == 0, out
    fresh = optuna.load_study(study_name="killed", storage=storage).trials
    assert len(fresh) == 6 and all(t.state == TrialState.COMPLETE for t in fresh)


def test_an_interrupted_grid_point_is_run_again_and_no_visited_one_twice(tmp_path: Path) -> None:
    from search.record.sampling.samplers import build_sampler
    from search.specs.schema import parse_spec
    from search.specs.space import sample

    spec = parse_spec(
        base_spec(
            tmp_path,
            sampler={"name": "grid", "seed": 0},
            space={"x": {"choice": [1, 2, 3]}},
            budget={"trials": 3},
        )
    )
    study = optuna.create_study(sampler=build_sampler(spec))
    seen = []
    for fate in (TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE):
        trial = study.ask()
        seen.append(sample(trial, spec.space)["x"])
        if fate == TrialState.FAIL:
            trial.set_user_attr("fail_reason", INTERRUPTED)
        study.tell(trial, 1.0 if fate == TrialState.COMPLETE else None, state=fate)
    replacement = sample(study.ask(), spec.space)["x"]
    assert sorted(seen) == [1, 2, 3] and replacement == seen[1]


def _out(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


@pytest.mark.slow
def test_one_driver_per_study_a_resume_that_checks_the_spec_and_continues_the_sampler(
    tmp_path: Path,
) -> None:
    """A second driver is refused; a compatible change resumes, recorded, and its sampler
    continues instead of replaying (no x twice); an incompatible one is refused."""
    gate = tmp_path / "gate"  # the first driver's trials wait for it: it runs until refused
    data = base_spec(
        tmp_path,
        study="owned",
        budget={"trials": 3, "max_epochs": 3},
        fixed={"sleep": 0.2, "hold_file": str(gate)},
        asha={"enabled": False},
    )
    spec = write_spec(tmp_path / "s.yaml", data)
    first = _run(spec)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and first.poll() is None:  # until it holds the study
        time.sleep(0.2)
        stored = stored_study(data["storage"], "owned")
        lease = stored.user_attrs.get("driver") if stored is not None else None
        if lease and not lease.get("released"):
            break
    assert first.poll() is None, "the first driver ended before its lease was seen"
    second = _run(spec)
    out = _out(second)
    assert second.returncode == 2, out
    assert "error: study 'owned' is being run by run " in out and "--takeover" in out
    gate.touch()
    assert first.wait(timeout=300) == 0
    study = optuna.load_study(study_name="owned", storage=data["storage"])
    assert len(study.trials) == 3  # one budget, not two

    more = _run(spec, "--trials", "4")  # a compatible change: resumed and recorded
    assert more.wait(timeout=300) == 0
    study = optuna.load_study(study_name="owned", storage=data["storage"])
    assert len(study.trials) == 4
    assert study.user_attrs["spec_history"][-1]["changed"]["budget"][1]["trials"] == 4
    xs = [t.params["x"] for t in study.trials]
    assert len(set(xs)) == 4, xs  # a replayed sampler would ask trial 0's x again

    changed = write_spec(
        tmp_path / "s.yaml", {**data, "objective": {"metric": "val_loss", "mode": "min"}}
    )
    refused = _run(changed)
    out = _out(refused)
    assert refused.returncode == 2, out
    assert (
        out.strip()
        .splitlines()[-1]
        .startswith(
            f"error: {changed}: objective: was {{'metric': 'val_accuracy', 'mode': 'max'}}, now"
        )
    )
    assert "--restart" in out
    study = optuna.load_study(study_name="owned", storage=data["storage"])
    assert study.user_attrs["spec"]["objective"]["metric"] == "val_accuracy"  # untouched
