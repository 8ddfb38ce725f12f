"""The write-behind storage: what the driver reads is what the storage holds once flushed."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from search.record.storage import open_storage
from search.record.writeback import WriteBehindStorage


def _pair(tmp_path: Path) -> tuple[optuna.Study, WriteBehindStorage, str]:
    url = f"sqlite:///{tmp_path}/optuna.db"
    plain = optuna.create_study(study_name="w", storage=open_storage(url), direction="maximize")
    storage = WriteBehindStorage(plain._storage)
    return optuna.Study(study_name="w", storage=storage), storage, url


def _essence(t: optuna.trial.FrozenTrial) -> tuple:
    return (t.number, t.state, t.values, t.params, t.user_attrs, t.intermediate_values)


def test_reads_see_queued_writes_and_the_storage_ends_identical(tmp_path: Path) -> None:
    study, storage, url = _pair(tmp_path)
    fates = [TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.COMPLETE]
    for i, fate in enumerate(fates):
        trial = study.ask()
        trial.suggest_float("x", 0.0, 1.0)
        trial.set_user_attr("device", "cpu")
        for epoch in (1, 2):
            trial.report(0.1 * i + 0.01 * epoch, epoch)
        trial.set_user_attr("epochs", 2)
        # tell of a PRUNED trial reads its last intermediate value through the overlay
        study.tell(trial, 0.5 if fate == TrialState.COMPLETE else None, state=fate)
    seen = [_essence(t) for t in study.get_trials()]
    storage.close()
    stored = optuna.load_study(study_name="w", storage=url).get_trials()
    assert [_essence(t) for t in stored] == seen
    assert [t.state for t in stored] == fates
    assert stored[1].value == pytest.approx(0.12)  # PRUNED keeps its last intermediate value
    assert stored[0].user_attrs == {"device": "cpu", "epochs": 2}


def test_a_running_trial_reads_from_its_local_copy(tmp_path: Path) -> None:
    study, storage, url = _pair(tmp_path)
    trial = study.ask()
    trial.suggest_int("n", 1, 4)
    trial.set_user_attr("k", "v")
    trial.report(0.3, 1)
    local = storage.get_trial(trial._trial_id)
    storage.flush()
    inner = storage.inner.get_trial(trial._trial_id)
    assert _essence(local) == _essence(inner)
    study.tell(trial, 1.0)
    storage.close()


def test_a_failed_background_write_is_raised_at_close(tmp_path: Path) -> None:
    study, storage, _ = _pair(tmp_path)
    trial = study.ask()
    study.tell(trial, 1.0)
    storage.flush()
    storage.set_trial_user_attr(trial._trial_id, "late", 1)  # the trial is already finished
    with pytest.raises(RuntimeError, match="study write"):
        storage.close()


def test_a_final_state_that_cannot_be_written_raises_at_tell_not_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study, storage, url = _pair(tmp_path)
    trial = study.ask()
    inner_write = storage.inner.set_trial_state_values

    def refuse(trial_id: int, state: TrialState, values: object = None) -> bool:
        if state.is_finished():
            raise OSError("disk full")
        return inner_write(trial_id, state, values)

    monkeypatch.setattr(storage.inner, "set_trial_state_values", refuse)
    with pytest.raises(OSError, match="disk full"):
        study.tell(trial, 1.0)
    monkeypatch.undo()
    storage.close()
    assert optuna.load_study(study_name="w", storage=url).trials[0].state == TrialState.RUNNING


def test_a_trial_whose_queued_write_failed_is_not_told_finished(tmp_path: Path) -> None:
    study, storage, url = _pair(tmp_path)
    trial = study.ask()
    trial.set_user_attr("bad", object())  # not JSON: the background write fails
    with pytest.raises(RuntimeError, match="earlier write"):
        study.tell(trial, 1.0)
    with pytest.raises(RuntimeError, match="study write"):
        storage.close()
    assert optuna.load_study(study_name="w", storage=url).trials[0].state == TrialState.RUNNING
