"""End to end on a real local Ray: every rule of the truthful Optuna record.

The synthetic ``search.testing:curve`` trainable makes the outcome of each trial predictable
from its parameters: ``lr > 1`` turns the loss NaN at epoch 2, ``raise_at: 4`` raises at epoch
4, ``stop_at: 5`` stops on its own after epoch 5, and ``x`` sets how good the curve gets.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml

from search.record.queries import write_results
from search.record.study import load_study
from search.specs.schema import load_spec, parse_spec
from search.tuning.runner import RunOptions, run_study
from tests.helpers import base_spec, deadline_after_first_epoch

pytestmark = [pytest.mark.ray]

MAX_EPOCHS = 9
RUNGS = {1, 3}  # ASHA, grace 1, reduction factor 3, max_t 9: stops at 1 or 3 are prunes


@pytest.fixture(scope="module")
def finished(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    tmp = tmp_path_factory.mktemp("e2e")
    spec = parse_spec(
        base_spec(
            tmp,
            study="truth",
            budget={"trials": 24, "max_epochs": MAX_EPOCHS},
            asha={"grace_period": 1, "reduction_factor": 3},
            sampler={"name": "random", "seed": 3},
            space={
                "x": {"uniform": [0.0, 1.0]},
                "lr": {"loguniform": [0.05, 3.0]},
                "raise_at": {"choice": [0, 4]},
                "stop_at": {"choice": [0, 5]},
                "fail_once_at": {"choice": [0, 2]},
            },
            faults={"max_failures": 1, "checkpoint_every_s": 0},  # retries resume mid-trial
        )
    )
    run_study(spec, RunOptions(results_dir=tmp / "results", progress=False))
    study = load_study("truth", spec.storage)
    return spec, study, tmp


def test_no_trial_is_left_running_or_waiting(finished: tuple) -> None:
    _, study, _ = finished
    states = Counter(t.state.name for t in study.trials)
    assert len(study.trials) == 24
    assert set(states) <= {"COMPLETE", "PRUNED", "FAIL"}
    assert states["PRUNED"] > 0 and states["FAIL"] > 0 and states["COMPLETE"] > 0


def test_one_intermediate_value_per_epoch_trained_including_the_last(finished: tuple) -> None:
    _, study, _ = finished
    for t in study.trials:
        epochs = t.user_attrs["epochs"]
        assert sorted(t.intermediate_values) == list(range(1, epochs + 1)), t.number


def test_fate_of_each_trial_follows_from_what_happened(finished: tuple) -> None:
    _, study, _ = finished
    for t in study.trials:
        p, epochs = t.params, t.user_attrs["epochs"]
        curve = t.intermediate_values
        if p["lr"] > 1.0 and epochs >= 2:
            assert t.state.name == "FAIL", t.number
            assert t.user_attrs["fail_reason"] == "val_loss is nan at epoch 2"
            assert epochs == 2  # stopped at the epoch the NaN appeared, not run to the end
        elif p["raise_at"] == 4 and epochs >= 3 and t.state.name == "FAIL":
            # the same error on its retry ends it; after another error's retry, Tune's last
            again = " (again on retry 1: not retried further)" if not p["fail_once_at"] else ""
            assert t.user_attrs["fail_reason"] == "ValueError: synthetic failure at epoch 4" + again
            assert epochs == 3
            assert t.user_attrs["retries"] == 1  # retried once from its checkpoint, then FAIL
        elif t.state.name == "PRUNED":
            assert epochs in RUNGS and epochs < MAX_EPOCHS
            assert t.value == curve[epochs]
        else:
            assert t.state.name == "COMPLETE", t.number
            assert t.value == curve[epochs]  # the metric of the last epoch
            assert epochs == MAX_EPOCHS or (p["stop_at"] == 5 and epochs == 5)
            assert not (p["raise_at"] == 4 and epochs >= 4)


def test_transient_failures_resume_from_the_checkpoint(finished: tuple) -> None:
    _, study, _ = finished
    flaky = [
        t for t in study.trials if t.params["fail_once_at"] == 2 and t.user_attrs["epochs"] >= 2
    ]
    assert flaky
    for t in flaky:
        assert t.user_attrs["retries"] >= 1
        if not (t.params["lr"] > 1.0 or t.params["raise_at"] == 4):
            assert t.state.name in ("COMPLETE", "PRUNED"), t.number  # the retry succeeded
    steady = [
        t for t in study.trials if t.params["fail_once_at"] == 0 and t.params["raise_at"] == 0
    ]
    assert all(t.user_attrs["retries"] == 0 for t in steady)


def test_each_trials_folder_is_named_by_its_study_trial_number(finished: tuple) -> None:
    _, study, _ = finished
    for t in study.trials:
        folder = Path(t.user_attrs["log"]).parent.name
        assert folder.startswith(f"trial_{t.number}_x={t.params['x']:.4g},"), folder
        assert folder.endswith(t.user_attrs["ray_trial_id"])


def test_user_attributes_and_stored_spec(finished: tuple) -> None:
    spec, study, _ = finished
    for t in study.trials:
        assert {"epochs", "seconds", "ray_trial_id", "device", "node"} <= set(t.user_attrs)
        assert t.user_attrs["device"] == "cpu"
    stored = study.user_attrs["spec"]
    assert stored["study"] == "truth" and stored["space"]["lr"] == {"loguniform": [0.05, 3.0]}
    assert parse_spec(stored) == spec


def test_results_files(finished: tuple) -> None:
    spec, study, tmp = finished
    folder = write_results(study, spec, tmp / "results")
    frame = pd.read_csv(folder / "trials.csv")
    assert len(frame) == 24
    assert {"number", "state", "value", "param_x", "epochs", "seconds"} <= set(frame.columns)
    best = yaml.safe_load((folder / "best.yaml").read_text())
    again = load_spec(folder / "best.yaml")  # a spec that `run` accepts as it is
    assert again.space == {} and again.budget.trials == 1
    assert best["fixed"]["x"] == study.best_trial.params["x"]
    assert again.sampler.seed == spec.sampler.seed + study.best_trial.number


def test_best_yaml_retrains_the_same_curve(finished: tuple) -> None:
    spec, study, tmp = finished
    again = load_spec(write_results(study, spec, tmp / "results") / "best.yaml")
    run_study(again, RunOptions(results_dir=tmp / "results", progress=False))
    retrained = load_study(again.study, again.storage).trials[0]
    assert retrained.state.name == "COMPLETE", retrained.user_attrs
    assert retrained.value == pytest.approx(study.best_value)


def test_stock_searcher_gets_it_wrong_and_ours_right(ray_local: None, tmp_path: Path) -> None:
    """The bridge exists because Ray's OptunaSearch loses the last epoch and marks prunes
    COMPLETE; this pins that the difference is real (and that we do not regress to it)."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    from search.contract import TrialContext
    from search.testing import curve

    def trainable(config: dict) -> None:
        for m in curve(config, None, TrialContext(max_epochs=MAX_EPOCHS)):  # type: ignore[arg-type]
            tune.report(m)

    storage = f"sqlite:///{tmp_path}/stock.db"
    study = optuna.create_study(study_name="stock", storage=storage, direction="maximize")
    searcher = OptunaSearch(
        {"x": optuna.distributions.FloatDistribution(0, 1)},
        study_name="stock",
        storage=study._storage,
        metric="val_accuracy",
        mode="max",
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            num_samples=8,
            scheduler=ASHAScheduler(metric="val_accuracy", mode="max", max_t=MAX_EPOCHS),
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "ray"), verbose=0),
    ).fit()
    stock = optuna.load_study(study_name="stock", storage=storage)
    states = {t.state.name for t in stock.trials}
    short = [t for t in stock.trials if len(t.intermediate_values) < MAX_EPOCHS]
    assert "PRUNED" not in states  # ASHA stopped some, yet none is recorded as pruned
    assert short  # and their curves miss epochs


def test_time_limit_stops_trials_and_records_them_truthfully(
    ray_local: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the load, the limit cuts a trial that trained (its clock waits for a first
    epoch: :func:`deadline_after_first_epoch`), and each trial's record says what it did."""
    deadline_after_first_epoch(monkeypatch)
    spec = parse_spec(
        base_spec(
            tmp_path,
            study="clock",
            budget={"trials": 4, "max_epochs": 100, "time_limit_s": 12},
            asha={"enabled": False},
            fixed={"sleep": 0.3},
        )
    )
    run_study(spec, RunOptions(results_dir=tmp_path / "results", progress=False))
    trials = load_study("clock", spec.storage).trials
    assert trials and all(t.state.is_finished() for t in trials)
    for t in trials:
        epochs = t.user_attrs["epochs"]
        if t.state.name == "PRUNED":
            assert t.user_attrs["stopped_by"] == "time limit" and 0 < epochs < 100
        else:  # nothing trains 100 epochs of 0.3 s in 12 s, so nothing else can be COMPLETE
            assert t.state.name == "FAIL" and epochs == 0, (t.number, t.state.name, epochs)
            assert t.user_attrs["fail_reason"] == "ended before its first epoch (time limit)"
    assert any(t.state.name == "PRUNED" for t in trials)


def test_a_retry_resumes_from_the_epoch_its_checkpoint_really_holds(
    ray_local: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """State saved on epochs 1, 3, 5 only; the first attempt fails at epoch 5. The epoch-4
    report must not relabel the epoch-3 state as epoch 4 (``curve`` asserts what it loads).
    The retry is said on the trial's console line and kept with its error in the record."""
    spec = parse_spec(
        base_spec(
            tmp_path,
            study="sparse",
            budget={"trials": 1, "max_epochs": 6},
            asha={"enabled": False},
            space={},
            fixed={"x": 0.9, "save_every": 2, "fail_once_at": 5},
            faults={"max_failures": 1, "checkpoint_every_s": 0},
        )
    )
    run_study(spec, RunOptions(results_dir=tmp_path / "results"))
    (trial,) = load_study("sparse", spec.storage).trials
    assert trial.state.name == "COMPLETE", trial.user_attrs.get("fail_reason")
    assert trial.user_attrs["retries"] == 1
    after = "RuntimeError: transient failure at epoch 5"
    assert trial.user_attrs["retried_after"] == [after]
    line = next(x for x in capsys.readouterr().err.splitlines() if "trial   0 COMPLETE" in x)
    assert line.endswith(f"(retried 1 time after {after})"), line
    assert sorted(trial.intermediate_values) == [1, 2, 3, 4, 5, 6]
