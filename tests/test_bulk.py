"""The bulk trial read builds exactly the trials Optuna's own RDB read builds."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from search.record.bulk import BulkReadRDBStorage, read_trials
from search.record.storage import open_storage

pytestmark = pytest.mark.slow  # over 5 s here: make test-fast leaves it out


def _plain(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """A trial's fields, comparable with ``==`` (NaN made a string)."""

    def fix(value: Any) -> Any:
        return "nan" if isinstance(value, float) and math.isnan(value) else value

    fields = dict(vars(trial))
    fields["intermediate_values"] = {k: fix(v) for k, v in trial.intermediate_values.items()}
    return fields


@pytest.fixture
def new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A local time zone other than UTC: stored UTC times must come back as local ones."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _fill(url: str) -> tuple[optuna.storages.RDBStorage, int]:
    """Trials of every shape: states, value kinds, parameter kinds, attributes."""
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(storage=storage, study_name="s", directions=["maximize"] * 2)
    other = optuna.create_study(storage=storage, study_name="other")
    other.optimize(lambda t: t.suggest_float("z", 0, 1), n_trials=2)  # not to be read
    for i in range(6):
        trial = study.ask()
        trial.suggest_float("lr", 1e-5, 1e-1, log=True)
        trial.suggest_int("batch", 16, 256, step=16)
        trial.suggest_categorical("opt", ["sgd", "adam", None])
        if i % 2:
            trial.suggest_float("momentum", 0.0, 0.99)
        curve = [0.1, float("nan"), float("inf"), -float("inf")][: i + 1]
        for step, value in enumerate(curve):  # a multi-objective trial refuses report()
            study._storage.set_trial_intermediate_value(trial._trial_id, step, value)
        trial.set_user_attr("metrics", {"acc": 0.5 + i, "nested": [1, 2]})
        study._storage.set_trial_system_attr(trial._trial_id, "search:run", f"r{i}")
        if i == 0:
            study.tell(trial, [0.5, float("inf")])
        elif i == 1:
            study.tell(trial, [-float("inf"), 0.25])
        elif i == 2:
            study.tell(trial, state=TrialState.PRUNED)
        elif i == 3:
            study.tell(trial, state=TrialState.FAIL)
        # 4 and 5 stay RUNNING
    study.enqueue_trial({"lr": 0.01})  # a WAITING trial
    return storage, study._study_id


@pytest.mark.parametrize(
    "states,included,greater",
    [
        (None, set(), -1),
        ((TrialState.COMPLETE, TrialState.RUNNING), set(), -1),
        (None, {3, 4, 5}, 5),  # Optuna's cache: the unfinished ones, and newer ones
        (None, set(), 6),
    ],
)
@pytest.mark.usefixtures("new_york")
def test_the_bulk_read_equals_optunas_read(
    tmp_path: Path, states: Any, included: set[int], greater: int
) -> None:
    storage, study_id = _fill(f"sqlite:///{tmp_path}/s.db")
    ours = read_trials(storage.engine, study_id, states, included, greater)
    theirs = storage._get_trials(study_id, states, included, greater)
    assert [t.number for t in ours] == [t.number for t in theirs]
    assert len(ours) >= 1
    assert [_plain(t) for t in ours] == [_plain(t) for t in theirs]


def test_a_missing_study_raises_keyerror_as_optuna_does(tmp_path: Path) -> None:
    storage, _ = _fill(f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(KeyError):
        read_trials(storage.engine, 999)


def test_open_storage_reads_through_the_bulk_read(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    _fill(url)
    storage = open_storage(url)
    assert isinstance(storage, BulkReadRDBStorage)
    study = optuna.load_study(study_name="s", storage=storage)
    expected = optuna.load_study(study_name="s", storage=url).trials
    assert [_plain(t) for t in study.trials] == [_plain(t) for t in expected]
