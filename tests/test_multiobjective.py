"""A multi-objective study end to end on a real local Ray: MO-ASHA prunes, the record stays
truthful (pruned = PRUNED, no intermediate values, nothing RUNNING), every objective's value
is kept, and the trials, the report and the front read it."""

from __future__ import annotations

import csv
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from search.handover.pareto import export_pareto
from search.record.queries import EPOCHS_FILE, pareto_trials, trials_frame
from search.record.study import load_study
from search.report.html import write_report
from search.specs.schema import load_spec, parse_spec, with_overrides
from search.tuning.runner import RunOptions, run_study
from tests.helpers import REPO, base_spec

pytestmark = [pytest.mark.ray]

TWO = [{"metric": "val_accuracy", "mode": "max"}, {"metric": "latency_ms", "mode": "min"}]


@pytest.fixture(scope="module")
def tradeoff(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    tmp = tmp_path_factory.mktemp("mo")
    spec = parse_spec(
        base_spec(
            tmp,
            study="mo",
            objective=TWO,
            budget={"trials": 12, "max_epochs": 9},
            asha={"grace_period": 1, "reduction_factor": 3},
            space={"x": {"uniform": [0.2, 1.0]}, "latency": {"uniform": [1.0, 10.0]}},
        )
    )
    options = RunOptions(results_dir=tmp / "results", progress=False)
    summary = run_study(spec, options)
    return spec, summary, load_study("mo", spec.storage), tmp / "results"


def test_the_study_has_both_directions_and_metric_names(tradeoff: tuple) -> None:
    _, _, study, _ = tradeoff
    assert study.directions == [
        optuna.study.StudyDirection.MAXIMIZE,
        optuna.study.StudyDirection.MINIMIZE,
    ]
    assert study.metric_names == ["val_accuracy", "latency_ms"]


def test_mo_asha_prunes_and_the_record_stays_truthful(tradeoff: tuple) -> None:
    _, summary, study, _ = tradeoff
    trials = study.get_trials()
    states = {t.state for t in trials}
    assert states <= {TrialState.COMPLETE, TrialState.PRUNED}, states
    assert TrialState.PRUNED in states and TrialState.COMPLETE in states
    for trial in trials:
        assert not trial.intermediate_values  # Optuna refuses report() with several objectives
        last = trial.user_attrs["metrics"]
        assert {"val_accuracy", "latency_ms"} <= set(last)
        if trial.state == TrialState.COMPLETE:
            assert trial.values == [last["val_accuracy"], last["latency_ms"]]
            assert trial.user_attrs["epochs"] == 9
        else:
            assert trial.values is None and trial.user_attrs["epochs"] < 9


def test_every_epoch_of_every_objective_is_in_the_epochs_table(tradeoff: tuple) -> None:
    _, _, study, results = tradeoff
    with (results / "mo" / EPOCHS_FILE).open() as f:
        rows = list(csv.DictReader(f))
    for trial in study.get_trials():
        latency = [
            r for r in rows if r["trial"] == str(trial.number) and r["metric"] == "latency_ms"
        ]
        assert len(latency) == trial.user_attrs["epochs"]


def test_the_front_and_the_trials_table(tradeoff: tuple) -> None:
    _, _, study, _ = tradeoff
    front = pareto_trials(study)
    assert front
    complete = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    for trial in front:  # nobody completes better on both
        acc, lat = trial.values
        assert not any(o.values[0] > acc and o.values[1] < lat for o in complete)
    frame = trials_frame(study)
    assert {"value_val_accuracy", "value_latency_ms", "pareto"} <= set(frame.columns)
    assert sorted(frame.loc[frame["pareto"], "number"]) == [t.number for t in front]


def test_the_report_shows_the_front_and_plots_the_first_objective(tradeoff: tuple) -> None:
    _, _, study, results = tradeoff
    page = write_report(study, results).read_text()
    assert f"Pareto front ({len(pareto_trials(study))} trials)" in page
    for name in ("pareto-front", "optimization-history", "slice", "metrics"):
        assert f'id="{name}"' in page, name  # drawn, not "not drawn: ..."
    assert "several objectives has no intermediate values" in page  # said, not an empty plot


def test_a_trial_without_the_second_objective_fails_with_its_name(
    ray_local: None, tmp_path: Path
) -> None:
    spec = parse_spec(
        base_spec(
            tmp_path, study="mo-missing", objective=TWO, budget={"trials": 2, "max_epochs": 2}
        )
    )
    run_study(spec, RunOptions(results_dir=tmp_path / "results", progress=False))
    trials = load_study("mo-missing", spec.storage).get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL] * 2
    assert all("latency_ms missing at epoch 1" in t.user_attrs["fail_reason"] for t in trials)


@pytest.mark.torch
@pytest.mark.slow
def test_the_tradeoff_space_finds_a_front_of_accuracy_and_latency(
    ray_local: None, tmp_path: Path
) -> None:
    spec = with_overrides(
        load_spec(REPO / "spaces" / "tradeoff.yaml"),
        **{"budget.trials": 12, "budget.max_epochs": 3, "storage": f"sqlite:///{tmp_path}/o.db"},
    )
    run_study(spec, RunOptions(results_dir=tmp_path / "results", progress=False))
    study = load_study(spec.study, spec.storage)
    states = {t.state for t in study.get_trials()}
    assert TrialState.PRUNED in states  # MO-ASHA stopped some at the first rung
    front = pareto_trials(study)
    assert len(front) >= 2, [t.values for t in front]  # a trade-off, not one best point
    by_latency = sorted(front, key=lambda t: t.values[1])
    accuracies = [t.values[0] for t in by_latency]
    assert accuracies == sorted(accuracies)  # a front: slower points must be more accurate

    # The Pareto export confirms every point (a fresh seed each) and bundles each one.
    result = export_pareto(
        spec.study, spec.storage, tmp_path / "pareto", seeds=1, results_dir=tmp_path / "results"
    )
    assert sorted(p.trial for p in result.points) == sorted(t.number for t in front)
    for point in result.points:
        assert point.bundle is not None
        assert (point.bundle.out_dir / "model.onnx").exists()
        assert point.confirmed["latency_ms"]["mean"] > 0
    assert (tmp_path / "pareto" / "pareto.png").exists()
