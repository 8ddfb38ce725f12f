"""The report's confirmation table: the best confirmed config first, whatever the direction."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from search.report.html import confirmation_rows


def _confirm(direction: str, values: dict[int, list[float | None]]) -> optuna.Study:
    """A confirm study: per source trial, one run per seed (None: the run failed)."""
    confirm = optuna.create_study(study_name="s-confirm", direction=direction)
    for source, runs in values.items():
        for seed, value in enumerate(runs):
            confirm.add_trial(
                create_trial(
                    state=TrialState.COMPLETE if value is not None else TrialState.FAIL,
                    value=value,
                    params={"lr": 0.1},
                    distributions={"lr": FloatDistribution(1e-3, 1.0)},
                    user_attrs={
                        "role": "confirm",
                        "source_trial": source,
                        "seed": seed,
                        "export_run": "run-1",
                    },
                )
            )
    return confirm


RUNS: dict[int, list[float | None]] = {
    3: [0.5, 0.7],  # mean 0.6
    5: [0.1, 0.3],  # mean 0.2
    8: [0.9, 0.9],  # mean 0.9
    9: [None, None],  # every seed failed: last, in both directions
}


@pytest.mark.parametrize(
    ("direction", "order"), [("minimize", ["5", "3", "8", "9"]), ("maximize", ["8", "3", "5", "9"])]
)
def test_the_best_mean_comes_first_in_the_objectives_direction(
    direction: str, order: list[str]
) -> None:
    rows = confirmation_rows(_confirm(direction, RUNS))
    assert [r[0] for r in rows] == order
    assert rows[0][1] == {"minimize": "0.2000", "maximize": "0.9000"}[direction]
    assert rows[-1][1:4] == ("nan", "0.0000", "2")


@pytest.mark.parametrize("direction", ["minimize", "maximize"])
def test_the_report_lists_the_candidates_in_the_order_export_chose_them(direction: str) -> None:
    """A candidate with a failed run and the best mean comes after one with none failed, in
    the report as in export (the report once ordered by the mean alone)."""
    from search.handover.candidates import Candidate
    from search.handover.confirm import ConfirmRun, confirmation_table

    best = {"minimize": 0.05, "maximize": 0.99}[direction]
    runs_by_trial: dict[int, list[float | None]] = {**RUNS, 4: [best, None]}
    runs = [
        ConfirmRun(trial, seed, history=[{"m": v}] if v is not None else [], fail_reason=None
                   if v is not None else "boom")
        for trial, values in runs_by_trial.items()
        for seed, v in enumerate(values)
    ]  # fmt: skip
    cands = [Candidate(t, 0.0, {"lr": 0.1}, {}) for t in runs_by_trial]
    mode = {"minimize": "min", "maximize": "max"}[direction]
    chosen = [r.source_trial for r in confirmation_table(cands, [0, 1], runs, "m", mode)]
    listed = [int(r[0]) for r in confirmation_rows(_confirm(direction, runs_by_trial))]
    assert listed == chosen
    assert chosen.index(4) > chosen.index(3)  # a failed run weighs more than the best mean
