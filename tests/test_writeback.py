"""The write-behind storage: what the driver reads is what the storage holds once flushed."""

from __future__ import annotations

import threading
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from search.record.storage import open_storage
from search.record.writeback import WriteBehindStorage
from search.tuning.bridge import running_template

pytestmark = pytest.mark.slow  # over 5 s here: make test-fast leaves it out


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


class _Counting:
    """Counts the reads of every trial that reach the wrapped storage."""

    def __init__(self, inner: optuna.storages.BaseStorage) -> None:
        self.inner, self.reads = inner, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def get_all_trials(self, *args: object, **kwargs: object) -> list:
        self.reads += 1
        return self.inner.get_all_trials(*args, **kwargs)


def test_reading_all_trials_uses_a_view_and_its_own_trials_are_current(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/optuna.db"
    plain = optuna.create_study(study_name="w", storage=open_storage(url), direction="maximize")
    counting = _Counting(plain._storage)
    storage = WriteBehindStorage(counting)  # type: ignore[arg-type]
    study = optuna.Study(study_name="w", storage=storage)
    monkeypatch.setattr("search.record.writeback.VIEW_EVERY_S", 3600.0)
    storage.get_all_trials(study._study_id)  # the view is read once
    finished = study.ask()
    finished.suggest_float("x", 0.0, 1.0)
    finished.report(0.4, 1)
    study.tell(finished, 0.7)
    running = study.ask()
    running.suggest_float("x", 0.0, 1.0)
    running.report(0.2, 1)
    other = plain.ask()  # another driver's trial, created after the view
    other.suggest_float("x", 0.0, 1.0)
    for _ in range(20):
        trials = storage.get_all_trials(study._study_id, deepcopy=False)
    assert counting.reads == 1  # the sampler's reads cost no query
    assert [(t.number, t.state.name) for t in trials] == [(0, "COMPLETE"), (1, "RUNNING")]
    assert trials[0].value == 0.7 and trials[0].intermediate_values == {1: 0.4}
    assert trials[1].intermediate_values == {1: 0.2} and "x" in trials[1].params
    monkeypatch.setattr("search.record.writeback.VIEW_EVERY_S", 0.0)
    trials = storage.get_all_trials(study._study_id, states=(TrialState.RUNNING,))
    assert [t.number for t in trials] == [1, 2]  # the other driver's, once the view is renewed
    study.tell(running, 0.1)
    storage.close()


def test_queued_writes_commit_together_and_a_bad_one_spoils_only_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from search.record import writer

    study, storage, url = _pair(tmp_path)
    good, bad = study.ask(), study.ask()
    batches: list[int] = []
    together = writer.write_together

    def counted(inner: object, writes: list, known: object = None) -> bool:
        batches.append(len(writes))
        if len(batches) == 1:
            gate.wait(10)  # the next writes queue up behind the first transaction
        return together(inner, writes, known)  # type: ignore[arg-type]

    monkeypatch.setattr(writer, "write_together", counted)
    gate = threading.Event()
    good.set_user_attr("gate", 0)
    for epoch in range(1, 6):
        good.report(0.1 * epoch, epoch)
    bad.set_user_attr("bad", object())  # not JSON: fails inside the batch
    good.set_user_attr("epochs", 5)
    gate.set()
    storage.flush()
    assert sum(batches) == 8 and len(batches) <= 2  # 8 writes, at most 2 transactions
    study.tell(good, 1.0)
    with pytest.raises(RuntimeError, match="earlier write"):
        study.tell(bad, 1.0)
    with pytest.raises(RuntimeError, match="study write"):
        storage.close()
    stored = optuna.load_study(study_name="w", storage=url).trials
    assert stored[0].intermediate_values == {e: pytest.approx(0.1 * e) for e in range(1, 6)}
    assert stored[0].user_attrs == {"gate": 0, "epochs": 5}
    assert stored[0].state == TrialState.COMPLETE and stored[1].state == TrialState.RUNNING


def test_parameters_are_queued_and_a_clashing_one_fails_its_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from search.record import writer

    study, storage, url = _pair(tmp_path)
    first = study.ask()
    first.suggest_float("lr", 1e-4, 1e-1, log=True)
    study.tell(first, 0.5)  # the study now knows lr as a float
    gate, holding = threading.Event(), threading.Event()
    together = writer.write_together

    def held(inner: object, writes: list, known: object = None) -> bool:  # what follows queues
        holding.set()
        gate.wait(10)
        return together(inner, writes, known)  # type: ignore[arg-type]

    monkeypatch.setattr(writer, "write_together", held)
    trial = study.ask()
    trial.set_user_attr("gate", 0)
    holding.wait(10)
    params = {
        "lr": trial.suggest_float("lr", 1e-4, 1e-1, log=True),
        "batch": trial.suggest_categorical("batch", [32, 64]),
        "layers": trial.suggest_int("layers", 1, 4),
    }
    stored = optuna.load_study(study_name="w", storage=url).trials[1]
    assert stored.params == {}  # queued, not committed at ask
    assert storage.get_trial(trial._trial_id).params == params  # the driver reads them
    gate.set()
    storage.flush()
    stored = optuna.load_study(study_name="w", storage=url).trials[1]
    assert stored.params == params
    assert stored.distributions == storage.get_trial(trial._trial_id).distributions

    clash = study.ask()  # lr as a category: the storage refuses it, and the trial's tell fails
    clash.suggest_categorical("lr", ["a", "b"])
    with pytest.raises(RuntimeError, match="earlier write"):
        study.tell(clash, 1.0)
    study.tell(trial, 1.0)
    with pytest.raises(RuntimeError, match="study write"):
        storage.close()
    states = [t.state for t in optuna.load_study(study_name="w", storage=url).trials]
    assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.RUNNING]


def test_a_trial_asked_and_told_here_is_never_read_back(tmp_path: Path) -> None:
    study, storage, url = _pair(tmp_path)
    reads: list[int] = []
    real = storage.inner.get_trial

    def counted(trial_id: int) -> optuna.trial.FrozenTrial:
        reads.append(trial_id)
        return real(trial_id)

    storage.inner.get_trial = counted  # type: ignore[method-assign]
    template = running_template("d")
    for i in range(3):  # as the bridge asks: the trial is born RUNNING from a template
        trial = optuna.Trial(study, storage.create_new_trial(study._study_id, template))
        trial.suggest_float("x", 0.0, 1.0)
        trial.report(0.5, 1)
        told = study.tell(trial, float(i))
        assert (told.number, told.state, told.user_attrs) == (
            i,
            TrialState.COMPLETE,
            {"driver": "d"},
        )
    assert reads == []
    seen = [_essence(t) for t in study.get_trials()]
    storage.close()
    stored = optuna.load_study(study_name="w", storage=url).get_trials()
    assert [_essence(t) for t in stored] == seen
