"""ASHA's rung refill, Hyperband brackets and the deadline stopper, driven by hand with fake
results (no Ray)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from search.errors import SpecError
from search.specs.derive import asha_milestones, ray_milestones
from search.specs.schema import parse_spec
from search.tuning.scheduler import PruneReportingASHA, build_scheduler
from search.tuning.stopping import RunStopper
from tests.helpers import base_spec


def _asha(reduction_factor: float, max_t: int = 9) -> PruneReportingASHA:
    return PruneReportingASHA(
        lambda _: None,
        time_attr="training_iteration",
        metric="acc",
        mode="max",
        max_t=max_t,
        grace_period=1,
        reduction_factor=reduction_factor,
    )


@pytest.mark.parametrize(
    ("rf", "epochs"),
    [
        (3, {1: 0.1, 3: 0.3, 9: 0.9}),
        (2.5, {1: 0.1, 2.5: 0.3, 6.25: 0.7}),  # Ray records rung 2.5 at epoch 3, 6.25 at epoch 7
    ],
)
def test_rungs_are_refilled_at_the_epoch_ray_records_them(rf: float, epochs: dict) -> None:
    asha = _asha(rf)
    curve = {e: e / 10 for e in range(1, 10)}
    assert asha.restore_rungs([curve]) == len(epochs)
    rungs = {m: r.get("earlier-0") for m, r in asha._brackets[0]._rungs}
    for milestone, value in epochs.items():
        assert rungs[milestone] == pytest.approx(value)


def test_milestones_are_rays_own() -> None:
    asha = _asha(2.5)
    assert sorted(m for m, _ in asha._brackets[0]._rungs) == ray_milestones(1, 2.5, 9)
    assert asha_milestones(1, 2.5, 9) == [1, 3, 7]
    assert asha_milestones(2, 3, 27) == [2, 6, 18]


def test_brackets_build_hyperband_with_later_first_rungs(tmp_path: Path) -> None:
    budget = {"trials": 4, "max_epochs": 27}
    spec = parse_spec(base_spec(tmp_path, budget=budget, asha={"brackets": 3}))
    scheduler = build_scheduler(spec, lambda _: None)
    assert isinstance(scheduler, PruneReportingASHA)
    rungs = [sorted(m for m, _ in bracket._rungs) for bracket in scheduler._brackets]
    # bracket s starts at grace_period * reduction_factor**s epochs
    assert rungs == [[1, 3, 9, 27], [3, 9, 27], [9, 27]]
    plain = build_scheduler(parse_spec(base_spec(tmp_path, budget=budget)), lambda _: None)
    assert isinstance(plain, PruneReportingASHA)
    assert len(plain._brackets) == 1


def test_brackets_with_several_objectives_are_refused_in_one_line(tmp_path: Path) -> None:
    objectives = [
        {"metric": "val_accuracy", "mode": "max"},
        {"metric": "latency_ms", "mode": "min"},
    ]
    data = base_spec(tmp_path, objective=objectives, asha={"brackets": 3})
    with pytest.raises(SpecError) as info:
        parse_spec(data, "mo.yaml")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("mo.yaml: asha.brackets: ")
    assert info.value.field == "asha.brackets"


def test_the_deadline_stops_running_trials_but_not_one_that_ended_itself() -> None:
    stopped: list[str] = []
    stopper = RunStopper(3600, stopped.append)
    assert not stopper("a", {"training_iteration": 5})
    assert not stopper("b", {"training_iteration": 2})
    stopper._deadline = time.monotonic() - 1  # the clock runs out
    assert stopper.expired and stopper.stop_all()
    # trial a's generator returned: Tune hands its last result (epoch 5) in once more
    assert not stopper("a", {"training_iteration": 5})
    assert stopper("b", {"training_iteration": 3})  # b was still training: cut
    assert stopped == ["b"]


def _drive(asha: PruneReportingASHA, curves: dict[str, list[float]]) -> dict[str, int]:
    """Runs the curves two at a time, one epoch each per step, in the order given; returns the
    epochs each trial trained before it stopped or finished."""
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    trained: dict[str, int] = {}
    names = list(curves)
    for name in names:
        asha.on_trial_add(None, SimpleNamespace(trial_id=name))
    running, waiting = names[:2], names[2:]
    while running:
        for name in list(running):
            epoch = trained.get(name, 0) + 1
            trained[name] = epoch
            result = {"training_iteration": epoch, "acc": curves[name][epoch - 1]}
            decision = asha.on_trial_result(None, SimpleNamespace(trial_id=name), result)
            if decision == TrialScheduler.STOP or epoch == len(curves[name]):
                running.remove(name)
                if waiting:
                    running.append(waiting.pop(0))
    return trained


def test_recheck_stops_a_free_first_arrival_that_later_arrivals_leave_behind() -> None:
    from search.specs.schema import parse_spec
    from search.tuning.scheduler import build_scheduler

    flat = [0.1] * 9  # the first arrival at every rung: passes each one for free
    good = [0.5 + e / 100 for e in range(9)]
    curves = {"junk": flat, "a": good, "b": good, "c": good}
    data = {
        "study": "s",
        "trainable": "search.testing:curve",
        "objective": {"metric": "acc", "mode": "max"},
        "budget": {"trials": 4, "max_epochs": 9},
    }
    for recheck, junk_epochs in [(False, 9), (True, 2)]:
        pruned: list[str] = []
        spec = parse_spec({**data, "asha": {"recheck": recheck}})
        trained = _drive(build_scheduler(spec, pruned.append), curves)  # type: ignore[arg-type]
        assert trained["junk"] == junk_epochs
        assert ("junk" in pruned) is recheck
        assert trained["a"] == 9  # a good trial is never held back by it
