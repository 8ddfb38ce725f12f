"""Picking a study up again after its driver died (``kill -9``, a lost machine, Ctrl-C).

Running the same ``run`` command again continues the same study. Once the new driver holds
the study's lease (:mod:`search.record.lease`), no other driver runs it, so every trial still
RUNNING or WAITING was left by a dead one:

* a trial whose fate was already decided (the bridge writes it in one write, :data:`FATE`,
  before the attributes and the state) gets that fate, as if its driver had lived;
* any other is recorded as FAIL with the reason :data:`INTERRUPTED` and replaced (it does not
  count against the budget, :func:`counts`; a dead driver is the world's doing, as
  :mod:`search.tuning.fate` says);
* COMPLETE, PRUNED and genuinely failed trials count, so the new run only adds what is left
  (trials a warm start imported were not run here, and do not);
* ASHA's rungs are refilled from the earlier trials' intermediate values
  (:meth:`search.tuning.scheduler.PruneReportingASHA.restore_rungs`), so a resumed run prunes
  against the same bar the first run set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

IMPORTED = "imported_from"
"""Trial user attribute of a trial a warm start copied from another study
(:mod:`search.record.warm`): not run here, so it never counts against the budget."""

INTERRUPTED = "interrupted: its driver stopped before the trial ended; replaced by a new trial"
FATE = "search:fate"
"""Trial system attribute: ``{"state", "values", "attrs"}``, the fate decided for it."""


def counts(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a finished trial counts against the budget: not one the world cut (FAIL with
    :data:`INTERRUPTED`, replaced; :mod:`search.tuning.fate` states the rule), nor one a warm
    start imported (not run here).

    Example:
        >>> from optuna.trial import create_trial
        >>> cut = create_trial(state=TrialState.FAIL, user_attrs={"fail_reason": INTERRUPTED})
        >>> counts(cut), counts(create_trial(value=0.5))
        (False, True)
    """
    return trial.state.is_finished() and not interrupted(trial) and IMPORTED not in trial.user_attrs


def interrupted(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether the world cut ``trial`` (FAIL with :data:`INTERRUPTED`): the next run replaces
    it, a grid point or a ``start_from`` config included."""
    return trial.user_attrs.get("fail_reason") == INTERRUPTED


def fate_record(
    state: TrialState, values: list[float] | None, attrs: Mapping[str, Any]
) -> dict[str, Any]:
    """What the bridge writes as :data:`FATE` before it tells the study."""
    return {"state": state.name, "values": values, "attrs": dict(attrs)}


@dataclass(frozen=True)
class Recovery:
    """What :func:`recover` found.

    Args:
        interrupted: Trials now FAIL with :data:`INTERRUPTED` (replaced).
        completed: Trials given the fate their dead driver had decided.
        counted: Finished trials that count against the budget.
    """

    interrupted: tuple[int, ...]
    counted: int
    completed: tuple[int, ...] = ()


def _apply_fate(storage: optuna.storages.BaseStorage, trial: optuna.trial.FrozenTrial) -> bool:
    fate = trial.system_attrs.get(FATE)
    if not isinstance(fate, dict):
        return False
    for key, value in fate.get("attrs", {}).items():
        storage.set_trial_user_attr(trial._trial_id, key, value)
    state = TrialState[fate["state"]]
    storage.set_trial_state_values(trial._trial_id, state, fate.get("values"))
    return True


def recover(study: optuna.Study) -> Recovery:
    """Settles every trial a dead driver left open (module docstring); counts the rest.

    Call it only while holding the study's lease.
    """
    storage = study._storage
    interrupted, completed = [], []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
        if _apply_fate(storage, trial):
            completed.append(trial.number)
        elif settle_open(storage, trial._trial_id):
            interrupted.append(trial.number)
    counted = sum(counts(t) for t in study.get_trials(deepcopy=False))
    return Recovery(tuple(interrupted), counted, tuple(completed))


def settle_open(storage: optuna.storages.BaseStorage, trial_id: int) -> bool:
    """Fails the trial as :data:`INTERRUPTED` (replaced, not counted) if it is still open;
    ``False`` when it was finished already: by a driver that took its study over meanwhile,
    which may settle it at the same moment (that write wins, this one gives way)."""
    from optuna.exceptions import UpdateFinishedTrialError

    try:
        if storage.get_trial(trial_id).state.is_finished():
            return False
        storage.set_trial_user_attr(trial_id, "fail_reason", INTERRUPTED)
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
    except UpdateFinishedTrialError:
        return False
    return True


def earlier_curves(study: optuna.Study) -> list[dict[int, float]]:
    """The learning curves of the study's finished trials, for refilling ASHA's rungs."""
    return [
        dict(t.intermediate_values)
        for t in study.get_trials(deepcopy=False)
        if t.state.is_finished() and t.intermediate_values
    ]
