"""The stall rule: a trial that hangs is stopped by the driver, recorded FAIL, and the run ends.

The runs use ``search.testing:curve`` with ``hang_at: 2, hang_trial: 0``: trial 0 reports its
first epoch, then sleeps for good inside the second, raising nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from search.errors import SpecError
from search.record.study import load_study
from search.specs.derive import incompatible_change
from search.specs.schema import parse_spec
from search.tuning.bridge import OptunaBridge
from search.tuning.runner import RunOptions, run_study
from search.tuning.stall import FLOOR_S, MULTIPLE, EpochTimes, StallWatch, stall_limit
from search.tuning.stopping import RunStopper
from tests.helpers import base_spec, deadline_after_first_epoch

STALL_S = 3.0
HANG = {"hang_at": 2, "hang_trial": 0}
TUNE_KILL_AFTER_S = 10.0  # Tune kills a trial asked to stop this long after (its own constant)


def test_auto_limit_is_a_multiple_of_the_median_epoch_with_a_floor() -> None:
    assert stall_limit(None, None) is None  # nothing timed yet: no limit
    assert stall_limit(None, 0.4) == FLOOR_S  # short epochs: the floor
    assert stall_limit(None, 30.0) == MULTIPLE * 30.0 > FLOOR_S
    assert stall_limit(4.0, None) == stall_limit(4.0, 30.0) == 4.0  # explicit: as given

    times = EpochTimes()
    assert times.median(first=True) is None and times.median(first=False) is None
    times.add(20.0, first=True)
    assert times.median(first=False) == 20.0  # no later epoch yet: the first ones stand in
    for seconds in (1.0, 9.0, 2.0):
        times.add(seconds, first=False)
    assert times.median(first=False) == 2.0 and times.median(first=True) == 20.0
    times.add(3.0, first=False)
    assert times.median(first=False) == 2.5


@dataclass
class _Trial:
    """What :class:`StallWatch` reads of a Tune trial."""

    trial_id: str
    status: str = "RUNNING"
    RUNNING: str = "RUNNING"
    max_failures: int = 2
    run_metadata: Any = field(default_factory=lambda: type("M", (), {"num_failures": 0}))
    temporary_state: Any = field(default_factory=lambda: type("S", (), {"ray_actor": None}))


def test_the_watch_times_first_epochs_apart_and_stops_a_silent_trial_once() -> None:
    now = [0.0]
    stalled: list[tuple[str, str]] = []
    watch = StallWatch(None, lambda tid, why: stalled.append((tid, why)), clock=lambda: now[0])
    fast, slow = _Trial("fast"), _Trial("slow")
    watch.on_trial_start(0, [], fast)
    watch.on_trial_start(0, [], slow)
    now[0] = 30.0  # a long first epoch (imports, data) is timed as a first epoch
    watch.on_trial_result(0, [], fast, {})
    watch.on_trial_result(0, [], slow, {})
    for _ in range(5):  # later epochs of 1 s: the floor applies to them
        now[0] += 1.0
        watch.on_trial_result(0, [], fast, {})
    now[0] += FLOOR_S - 1.0  # slow: silent FLOOR_S + 4 s since its first epoch
    watch.on_step_begin(0, [fast, slow])
    assert [tid for tid, _ in stalled] == ["slow"]
    assert stalled[0][1] == "stalled: no epoch for 64 s (median epoch 1 s)"
    assert slow.max_failures == 0  # the kill is its first failure: Tune must not retry it
    now[0] += 100.0
    watch.on_step_begin(0, [fast, slow])  # slow is handled; fast has been silent 159 s
    assert [tid for tid, _ in stalled] == ["slow", "fast"]


def test_the_bridge_records_a_stalled_trial_fail_and_not_as_a_code_error() -> None:
    study = optuna.create_study(direction="maximize")
    bridge = OptunaBridge(study, {}, {}, metric="val_accuracy", mode="max", max_epochs=3)
    bridge.suggest("hung")
    bridge.on_trial_result("hung", {"val_accuracy": 0.5, "training_iteration": 1})
    bridge.mark_interrupted("hung", "time limit")  # the deadline came too: the hang says why
    bridge.mark_stalled("hung", "stalled: no epoch for 7 s (faults.stall_s 6 s)")
    bridge.on_trial_complete("hung", error=True)  # the kill, as Tune reports it
    bridge.record_error("hung", "RayActorError: The actor died", "/t/error.txt")
    outcome = bridge.outcomes["hung"]
    assert outcome.state == "FAIL" and not outcome.code_error and outcome.traceback is None
    assert outcome.reason == "stalled: no epoch for 7 s (faults.stall_s 6 s)"
    assert study.trials[0].user_attrs["fail_reason"] == outcome.reason


def test_stall_s_is_validated_in_one_line_and_auto_leaves_the_stored_spec_as_before(
    tmp_path: Path,
) -> None:
    data = base_spec(tmp_path)
    for bad in (0, -2, "soon", True):
        with pytest.raises(SpecError) as err:
            parse_spec({**data, "faults": {"stall_s": bad}}, "s.yaml")
        assert str(err.value) == (
            f"s.yaml: faults.stall_s: expected a number of seconds > 0 or 'auto', got {bad!r}"
        )
    assert parse_spec({**data, "faults": {"stall_s": 90}}).faults.stall_s == 90.0
    auto = parse_spec({**data, "faults": {"stall_s": "auto"}})
    old = parse_spec(data).to_dict()  # as a study stored before the field existed
    assert auto.faults.stall_s is None and auto.to_dict() == old
    assert incompatible_change(old, parse_spec({**data, "faults": {"stall_s": 5}})) is None


def _hung_run(tmp_path: Path, one_slot: bool, **budget: Any) -> list[optuna.trial.FrozenTrial]:
    """Trial 0 hangs in epoch 2; ``one_slot``: one trial at a time, so the next trial needs the
    hung one's slot."""
    spec = parse_spec(
        base_spec(
            tmp_path,
            budget={"trials": 3, "max_epochs": 3, **budget},
            asha={"enabled": False},
            resources={"max_concurrent": 1 if one_slot else 2},
            faults={"stall_s": STALL_S},
            fixed=HANG,
        )
    )
    run_study(spec, RunOptions(results_dir=tmp_path / "results", progress=False))
    return load_study("t", spec.storage).trials


def _assert_stalled(trial: optuna.trial.FrozenTrial) -> None:
    assert trial.state == TrialState.FAIL
    reason = trial.user_attrs["fail_reason"]
    found = re.fullmatch(
        rf"stalled: no epoch for ([\d.]+) s \(faults\.stall_s {STALL_S:g} s\)", reason
    )
    assert found and float(found.group(1)) >= STALL_S, reason
    assert trial.user_attrs["epochs"] == 1 and trial.user_attrs["retries"] == 0
    assert "stopped_by" not in trial.user_attrs


@pytest.mark.ray
@pytest.mark.timeout(240)  # before the stall rule, this run never ended
def test_a_hung_trial_is_stopped_and_the_run_ends(ray_local: None, tmp_path: Path) -> None:
    trials = _hung_run(tmp_path, one_slot=True)
    assert len(trials) == 3
    _assert_stalled(trials[0])
    assert [t.state for t in trials[1:]] == [TrialState.COMPLETE] * 2  # they got its slot


@pytest.mark.ray
def test_with_a_time_limit_the_hung_trial_is_recorded_stalled_not_pruned(
    ray_local: None, tmp_path: Path
) -> None:
    trials = _hung_run(tmp_path, one_slot=False, time_limit_s=120)
    assert trials and all(t.state.is_finished() for t in trials)
    _assert_stalled(trials[0])


@pytest.mark.ray
def test_a_hung_trial_ends_within_seconds_of_the_time_limit(
    ray_local: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tune stops the trials at the time limit, but its stop waits for the epoch in progress
    and kills a trial's process only 10 s later (a hung trial ended that long past the limit);
    the hung trial is recorded ended within GRACE_S and a kill of the run's stop, measured on
    the driver's clock from the moment the run stopped, not from when the test began."""
    deadline_after_first_epoch(monkeypatch)  # the hung trial has its epoch 1 whatever the load
    stopped_at: list[datetime] = []
    stop_all = RunStopper.stop_all

    def timed_stop_all(self: RunStopper) -> bool:
        stopped = stop_all(self)
        if stopped and not stopped_at:
            stopped_at.append(datetime.now())  # Optuna's clock for datetime_complete
        return stopped

    monkeypatch.setattr(RunStopper, "stop_all", timed_stop_all)
    spec = parse_spec(
        base_spec(
            tmp_path,
            budget={"trials": 1, "max_epochs": 3, "time_limit_s": 5.0},
            asha={"enabled": False},
            fixed=HANG,  # the stall rule (auto: at least FLOOR_S) is far off
        )
    )
    run_study(spec, RunOptions(results_dir=tmp_path / "results", progress=False))
    [trial] = load_study("t", spec.storage).trials
    assert trial.state == TrialState.PRUNED and trial.user_attrs["epochs"] == 1
    assert trial.user_attrs["stopped_by"] == "time limit"
    assert stopped_at and trial.datetime_complete is not None
    held = (trial.datetime_complete - stopped_at[0]).total_seconds()
    assert held < TUNE_KILL_AFTER_S, held  # killed GRACE_S after the stop, not Tune's 10 s
