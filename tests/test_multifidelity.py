"""The multi-fidelity Hartmann 6 benchmark function: its known minimum, and a bias, a noise and
a cost that behave as the published definition says; and the benchmark's reckoning of the
compute to reach a regret (no Ray, milliseconds)."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest

from benchmarks import multifidelity_report as report
from benchmarks.mfhartmann import (
    F_STAR,
    PRESETS,
    X_STAR,
    hartmann6,
    log_fidelity,
    noise_scale,
    regret,
    train,
    trial_cost,
    value_at,
)
from search.contract import TrialContext


def test_the_known_minimum_at_full_fidelity() -> None:
    assert hartmann6(X_STAR) == pytest.approx(F_STAR, abs=1e-5)
    assert regret(X_STAR) == pytest.approx(0.0, abs=1e-5)
    points = np.random.default_rng(0).random((2000, 6))
    assert min(regret(x) for x in points) > 0.0  # nowhere below the minimum


def test_fidelity_is_mf_prior_bench_log_scale() -> None:
    assert log_fidelity(1.0) == 1.0
    assert log_fidelity(3 / 100) == pytest.approx(math.log(3) / math.log(100))
    assert log_fidelity(1 / 100) == log_fidelity(1 / 1000) == 0.0


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_bias_shrinks_to_0_at_full_fidelity(preset: str) -> None:
    bias, _ = PRESETS[preset]
    x = [0.3, 0.4, 0.5, 0.6, 0.7, 0.2]
    gaps = [abs(hartmann6(x, s, bias) - hartmann6(x)) for s in (0.0, 0.5, 1.0)]
    assert gaps[0] > gaps[1] > gaps[2] == 0.0
    # full fidelity, noise-free, whatever the preset and seed: Hartmann 6 itself
    assert value_at(X_STAR, 27, 27, preset, seed=3) == pytest.approx(F_STAR, abs=1e-5)


def test_the_noise_shrinks_with_fidelity() -> None:
    scales = [noise_scale(log_fidelity(z), 2.0) for z in (0.01, 0.1, 0.5, 1.0)]
    assert scales == sorted(scales, reverse=True) and scales[0] == 2.0 and scales[-1] == 0.0
    x = [0.5] * 6
    spread = [
        np.std([value_at(x, epoch, 27, "good", seed) for seed in range(200)])
        for epoch in (1, 9, 27)
    ]
    assert spread[0] > spread[1] > 10 * spread[2]
    assert spread[2] == pytest.approx(0.0, abs=1e-12)


def test_a_trial_costs_lambda_of_its_last_fidelity() -> None:
    assert trial_cost(0, 27) == 0.0
    assert trial_cost(27, 27) == pytest.approx(1.0)
    assert trial_cost(1, 27) == pytest.approx(0.05 + 0.95 / 27**2)
    steps = [trial_cost(e, 27) - trial_cost(e - 1, 27) for e in range(2, 28)]
    assert steps == sorted(steps)  # later epochs cost more


def test_the_trainable_yields_one_value_per_epoch_reproducibly() -> None:
    config = dict(zip([f"x{i}" for i in range(6)], X_STAR, strict=True)) | {"preset": "good"}
    curves = [
        [m["value"] for m in train(config, None, TrialContext(max_epochs=9, seed=5))]
        for _ in range(2)
    ]
    assert curves[0] == curves[1] and len(curves[0]) == 9
    assert curves[0][-1] == pytest.approx(F_STAR, abs=1e-5)


def _study_with(trials: list[tuple[str, int, float]]) -> optuna.Study:
    """A study whose trials (state, epochs, final value) are recorded as the bridge does."""
    study = optuna.create_study(study_name="s", storage=optuna.storages.InMemoryStorage())
    for state, epochs, value in trials:
        trial = study.ask()
        for epoch in range(1, epochs + 1):
            trial.report(value, epoch)
        if state == "COMPLETE":
            study.tell(trial, value)
        else:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    return study


def test_compute_to_reach_a_regret_counts_trials_in_creation_order() -> None:
    none = _study_with([("COMPLETE", 9, 0.5), ("COMPLETE", 9, 0.2), ("COMPLETE", 9, 0.3)])
    asha = _study_with([("PRUNED", 1, 0.9), ("COMPLETE", 9, 0.4), ("PRUNED", 3, 0.1)])
    asha_tail = _study_with([("COMPLETE", 9, 0.1)])

    def read(study: optuna.Study) -> list[report.Step]:
        def seconds(trial: optuna.trial.FrozenTrial, epochs: int) -> float:
            return 2.0 * epochs

        return report.read_steps(study._storage, "s", lambda t: float(t.values[0]), seconds)

    steps = {("none", 0): read(none), ("asha", 0): read(asha), ("hyperband", 0): read(asha_tail)}
    assert [s.cum_epochs for s in steps[("asha", 0)]] == [1, 10, 13]
    assert [s.best for s in steps[("asha", 0)]] == [math.inf, 0.4, 0.4]  # PRUNED never counts
    rows = {r.scheduler: r for r in report.rows_for("t", steps, {})}
    assert rows["none"].target == 0.2 and rows["none"].reach_epochs == 18
    assert rows["none"].ratio_epochs == pytest.approx(18 / 27)
    assert math.isinf(rows["asha"].reach_epochs)  # 0.4 never reaches 0.2
    assert rows["hyperband"].reach_epochs == 9 and rows["hyperband"].ratio_seconds == 18 / 54
    assert "| t | asha | 1 | 3 | 13 |" in report.table(list(rows.values()), "s")
