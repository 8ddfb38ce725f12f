"""MO-ASHA and the Pareto ranking under it, driven by hand with fake results (no Ray cluster)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest
from ray.tune.schedulers import AsyncHyperBandScheduler

from search.record.pareto import (
    crowding_distance,
    dominates,
    nondominated_sort,
    pareto_front,
    rank_keys,
)
from search.tuning.moasha import MultiObjectiveASHA

NAN = float("nan")
INF = float("inf")
ACC_MS = ["max", "min"]


def rank_order(points: list[tuple[float, ...]], directions: list[str]) -> list[int]:
    """Every index, best first, by :func:`rank_keys` (the order MO-ASHA cuts by), then by
    index: a total order, the same on every run."""
    keys = rank_keys(points, directions)
    return sorted(range(len(points)), key=lambda index: (keys[index], index))


@dataclass(frozen=True)
class FakeTrial:
    trial_id: str


def _moasha(
    pruned: list[str], metrics: list[str], modes: list[str], **kwargs: float
) -> MultiObjectiveASHA:
    settings = {"max_t": 9, "grace_period": 1, "reduction_factor": 3, **kwargs}
    return MultiObjectiveASHA(pruned.append, metrics, modes, **settings)


def _report(asha: MultiObjectiveASHA, trial: str, epoch: int, **metrics: float) -> str:
    return asha.on_trial_result(None, FakeTrial(trial), {"training_iteration": epoch, **metrics})


# --- pareto.py -------------------------------------------------------------------------------


def test_dominance_follows_each_objectives_direction() -> None:
    assert dominates((0.9, 10.0), (0.8, 20.0), ACC_MS)
    assert not dominates((0.8, 20.0), (0.9, 10.0), ACC_MS)
    assert not dominates((0.9, 20.0), (0.8, 10.0), ACC_MS)  # better on one, worse on the other
    assert not dominates((0.9, 10.0), (0.9, 10.0), ACC_MS)  # equal: neither dominates
    assert dominates((0.9, 20.0), (0.9, 10.0), ["max", "max"])


def test_non_finite_vectors_are_dominated_by_every_finite_one() -> None:
    for bad in [(NAN, 1.0), (0.99, INF), (-INF, 1.0)]:
        assert dominates((0.0, 1e9), bad, ACC_MS)
        assert not dominates(bad, (0.0, 1e9), ACC_MS)
    assert not dominates((NAN, 1.0), (NAN, 2.0), ACC_MS)


def test_fronts_first_front_first() -> None:
    points = [(0.7, 20.0), (0.9, 30.0), (0.85, 20.0), (0.8, 10.0), (0.6, 50.0), (NAN, 1.0)]
    assert nondominated_sort(points, ACC_MS) == [[1, 2, 3], [0], [4], [5]]
    assert pareto_front(points, ACC_MS) == [1, 2, 3]
    assert nondominated_sort([], ACC_MS) == [] and pareto_front([], ACC_MS) == []


@pytest.mark.parametrize("seed", range(5))
def test_fronts_agree_with_the_definition(seed: int) -> None:
    rng = np.random.default_rng(seed)
    points = [tuple(p) for p in rng.integers(0, 5, size=(30, 3)).astype(float)]
    directions = ["max", "min", "max"]
    fronts = nondominated_sort(points, directions)
    assert sorted(i for front in fronts for i in front) == list(range(30))
    for number, front in enumerate(fronts):
        later = [j for f in fronts[number:] for j in f]
        for i in front:  # nothing in this front or later dominates it
            assert not any(dominates(points[j], points[i], directions) for j in later)
            if number:  # something in the front before does
                assert any(dominates(points[j], points[i], directions) for j in fronts[number - 1])


def test_crowding_distance() -> None:
    points = [(0.0, 4.0), (1.0, 3.0), (3.0, 1.0), (4.0, 0.0), (1.0, 3.0)]
    assert crowding_distance(points, [0, 1, 2, 3, 4], ["max", "max"]) == [INF, 1.5, 1.5, INF, 1.5]
    assert crowding_distance(points, [3, 0], ["max", "max"]) == [INF, INF]  # only its indices
    assert crowding_distance([(1.0, 2.0)] * 3, [0, 1, 2], ACC_MS) == [0.0, 0.0, 0.0]  # all agree
    assert crowding_distance([(NAN, 1.0), (0.5, 2.0)], [0, 1], ACC_MS) == [0.0, 0.0]


def test_rank_order_by_front_then_crowding_then_index() -> None:
    points = [(0.7, 20.0), (0.9, 30.0), (0.85, 20.0), (0.8, 10.0), (0.88, 26.0), (0.6, 50.0)]
    # front 0: 1 and 3 are extremes (inf, by index), 2 lonelier (1.6) than 4 (1.0); then 0, 5
    assert rank_order(points, ACC_MS) == [1, 3, 2, 4, 0, 5]
    assert rank_order([(1.0, 1.0)] * 4, ACC_MS) == [0, 1, 2, 3]  # ties: by index
    assert rank_order([(NAN, 0.0), (0.1, 99.0), (0.2, INF)], ACC_MS) == [1, 0, 2]
    assert rank_order([(3.0,), (1.0,), (2.0,)], ["min"]) == [1, 2, 0]


def test_directions_are_checked() -> None:
    with pytest.raises(ValueError, match="'max' or 'min'"):
        rank_order([(1.0,)], ["maximize"])


# --- MultiObjectiveASHA ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["max", "min"])
@pytest.mark.parametrize("seed", range(6))
def test_one_objective_decides_exactly_as_rays_asha(mode: str, seed: int) -> None:
    rng = random.Random(seed)
    rf, grace, max_t = rng.choice([(2, 1, 16), (3, 1, 27), (2.5, 1, 9), (3, 2, 20)])
    ray_asha = AsyncHyperBandScheduler(
        metric="m", mode=mode, max_t=max_t, grace_period=grace, reduction_factor=rf
    )
    pruned: list[str] = []
    ours = _moasha(pruned, ["m"], [mode], max_t=max_t, grace_period=grace, reduction_factor=rf)
    epoch: dict[str, int] = {}
    ray_stops_early = []
    for step in range(600):  # trials start, report and stop in a random interleaving
        if len(epoch) < 6 and rng.random() < 0.3:
            epoch[f"t{step}"] = 0
            ray_asha.on_trial_add(None, FakeTrial(f"t{step}"))
        if not epoch:
            continue
        name = rng.choice(sorted(epoch))
        epoch[name] += rng.choice([1, 1, 1, 2])  # now and then an epoch goes unreported
        value = rng.random() if rng.random() < 0.5 else round(rng.random(), 1)  # with ties
        result = {"training_iteration": epoch[name], "m": value}
        expected = ray_asha.on_trial_result(None, FakeTrial(name), result)
        assert _report(ours, name, epoch[name], m=value) == expected, (step, name, result)
        if expected == "STOP":
            ray_asha.on_trial_complete(None, FakeTrial(name), result)
            ours.on_trial_complete(None, FakeTrial(name), result)
            if epoch.pop(name) < max_t:
                ray_stops_early.append(name)
    assert pruned == ray_stops_early and pruned  # the stream did prune


def test_identical_vectors_tie_and_continue() -> None:
    pruned: list[str] = []
    asha = _moasha(pruned, ["acc", "ms"], ACC_MS)
    for name in "abcdefgh":
        assert _report(asha, name, 1, acc=0.5, ms=20.0) == "CONTINUE"
    single = _moasha(pruned, ["acc"], ["max"])
    for name in "abcdefgh":
        assert _report(single, name, 1, acc=0.5) == "CONTINUE"
    assert pruned == []


def test_a_dominated_trial_is_pruned_at_the_rung() -> None:
    pruned: list[str] = []
    asha = _moasha(pruned, ["acc", "ms"], ACC_MS)
    assert _report(asha, "a", 1, acc=0.9, ms=10.0) == "CONTINUE"
    assert _report(asha, "b", 1, acc=0.8, ms=20.0) == "STOP"  # worse on both
    assert _report(asha, "c", 1, acc=0.95, ms=40.0) == "CONTINUE"  # more accurate, slower
    assert _report(asha, "d", 1, acc=0.5, ms=5.0) == "CONTINUE"  # faster
    assert pruned == ["b"]


def test_pareto_optimal_trial_survives_though_best_on_neither_objective() -> None:
    pruned: list[str] = []
    asha = _moasha(pruned, ["acc", "ms"], ACC_MS)
    _report(asha, "most-accurate", 1, acc=0.95, ms=50.0)
    _report(asha, "fastest", 1, acc=0.60, ms=5.0)
    for i in range(6):  # dominated by the middle one below
        _report(asha, f"weak{i}", 1, acc=0.5 - i / 100, ms=60.0 + i)
    assert _report(asha, "middle", 1, acc=0.80, ms=20.0) == "CONTINUE"  # third of nine
    assert _report(asha, "weak-late", 1, acc=0.49, ms=61.0) == "STOP"
    assert pruned == [f"weak{i}" for i in range(6)] + ["weak-late"]


def test_each_trial_is_judged_once_per_rung() -> None:
    pruned: list[str] = []
    asha = _moasha(pruned, ["acc", "ms"], ACC_MS)
    _report(asha, "a", 1, acc=0.9, ms=10.0)
    assert _report(asha, "b", 1, acc=0.95, ms=12.0) == "CONTINUE"
    assert _report(asha, "b", 2, acc=0.1, ms=99.0) == "CONTINUE"  # between milestones
    assert _report(asha, "a", 3, acc=0.9, ms=10.0) == "CONTINUE"
    assert _report(asha, "b", 3, acc=0.1, ms=99.0) == "STOP"  # rung 3: dominated by a
    assert pruned == ["b"]


def test_reaching_max_t_stops_without_a_prune() -> None:
    pruned: list[str] = []
    asha = _moasha(pruned, ["acc", "ms"], ACC_MS)
    _report(asha, "a", 3, acc=0.9, ms=10.0)
    assert _report(asha, "b", 9, acc=0.0, ms=999.0) == "STOP"
    assert _report(asha, "c", 12, acc=NAN, ms=1.0) == "STOP"
    assert pruned == []


def test_non_finite_and_missing_values_rank_last_without_raising() -> None:
    pruned: list[str] = []
    asha = _moasha(pruned, ["acc", "ms"], ACC_MS)
    assert _report(asha, "diverged", 1, acc=NAN, ms=10.0) == "CONTINUE"  # first at its rung
    assert _report(asha, "poor", 1, acc=0.01, ms=500.0) == "CONTINUE"  # still beats NaN
    assert _report(asha, "good", 1, acc=0.9, ms=10.0) == "CONTINUE"
    assert _report(asha, "inf", 1, acc=0.5, ms=INF) == "STOP"
    assert _report(asha, "missing", 1, acc=0.99) == "STOP"
    # three of five entries now score -inf: the cutoff is -inf, and a tie with it continues
    odd = {"training_iteration": 1, "acc": "x", "ms": None}
    assert asha.on_trial_result(None, FakeTrial("odd"), odd) == "CONTINUE"
    assert asha.on_trial_result(None, FakeTrial("no-time"), {"acc": 0.5, "ms": 1.0}) == "CONTINUE"
    single = _moasha(pruned, ["loss"], ["min"])
    assert _report(single, "a", 1, loss=NAN) == "CONTINUE"
    assert _report(single, "b", 1, loss=1e9) == "CONTINUE"  # beats NaN
    # the cutoff of {-inf, -1e9} interpolates to -inf, and a score equal to it continues
    assert _report(single, "c", 1, loss=2e9) == "CONTINUE"
    assert _report(single, "d", 1, loss=-INF) == "STOP"  # a minimised -inf is no win either
    assert pruned == ["inf", "missing", "d"]


def test_completion_records_a_rung_the_trial_had_not_reached() -> None:
    pruned: list[str] = []
    asha = _moasha(pruned, ["acc", "ms"], ACC_MS)
    asha.on_trial_complete(None, FakeTrial("a"), {"training_iteration": 3, "acc": 0.9, "ms": 1.0})
    assert _report(asha, "b", 3, acc=0.5, ms=2.0) == "STOP"


@pytest.mark.parametrize(("rf", "epochs"), [(3, [1, 3, 9]), (2.5, [1, 3, 7])])
def test_restore_rungs_refills_vectors_at_rays_epochs(rf: float, epochs: list[int]) -> None:
    pruned: list[str] = []
    asha = _moasha(pruned, ["acc", "ms"], ACC_MS, reduction_factor=rf)
    curve = {e: (e / 10, 100.0 - e) for e in range(1, 10)}
    assert asha.restore_rungs([curve, {1: (0.5,)}]) == len(epochs)  # a short vector is skipped
    rungs = sorted(asha._rungs)  # lowest milestone first
    for (_, recorded), epoch in zip(rungs, epochs, strict=True):
        assert recorded == {"earlier-0": (epoch / 10, 100.0 - epoch)}
    assert _report(asha, "new", 1, acc=0.05, ms=100.0) == "STOP"  # dominated by earlier-0
    assert pruned == ["new"]


def test_tune_may_set_its_metric_and_the_arguments_are_checked() -> None:
    asha = _moasha([], ["acc", "ms"], ACC_MS)
    assert asha.set_search_properties("acc", "max")
    assert "num_stopped=0" in asha.debug_string()
    with pytest.raises(ValueError, match="one mode"):
        _moasha([], ["acc", "ms"], ["max"])
    with pytest.raises(ValueError, match="reduction_factor"):
        _moasha([], ["acc"], ["max"], reduction_factor=1)
