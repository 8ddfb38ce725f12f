"""Picking a study up again after its driver died (``kill -9``, a lost machine, Ctrl-C).

Running the same ``run`` command again continues the same study:

* trials this machine's dead drivers left RUNNING or WAITING are recorded as FAIL with the
  reason ``interrupted`` and replaced (they do not count against the budget);
* COMPLETE, PRUNED and genuinely failed trials count, so the new run only adds what is left;
* the sampler sees every earlier trial (it reads the same study);
* ASHA's rungs are refilled from the earlier trials' intermediate values
  (:meth:`search.run.scheduler.PruneReportingASHA.restore_rungs`), so a resumed run prunes against
  the same bar the first run set.

A trial whose driver is still alive, or runs on another machine sharing the storage, is left
alone: each trial records its driver as ``host:pid``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

INTERRUPTED = "interrupted: its driver stopped before the trial ended; replaced by a new trial"


def driver_id() -> str:
    """This process as ``host:pid``, recorded on every trial it runs."""
    return f"{socket.gethostname()}:{os.getpid()}"


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _orphaned(trial: optuna.trial.FrozenTrial, alive: Callable[[int], bool]) -> bool:
    host, _, pid = str(trial.user_attrs.get("driver", "")).rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return not alive(int(pid))


@dataclass(frozen=True)
class Recovery:
    """What :func:`recover` found: trials it failed, and trials that count against the budget."""

    interrupted: tuple[int, ...]
    counted: int


def recover(study: optuna.Study, alive: Callable[[int], bool] = pid_alive) -> Recovery:
    """Fails the trials that dead drivers on this machine left open; counts the rest."""
    interrupted = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
        if _orphaned(trial, alive):
            study._storage.set_trial_user_attr(trial._trial_id, "fail_reason", INTERRUPTED)
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            interrupted.append(trial.number)
    counted = sum(
        1
        for t in study.get_trials(deepcopy=False)
        if t.state.is_finished() and t.user_attrs.get("fail_reason") != INTERRUPTED
    )
    return Recovery(tuple(interrupted), counted)


def earlier_curves(study: optuna.Study) -> list[dict[int, float]]:
    """The learning curves of the study's finished trials, for refilling ASHA's rungs."""
    return [
        dict(t.intermediate_values)
        for t in study.get_trials(deepcopy=False)
        if t.state.is_finished() and t.intermediate_values
    ]
