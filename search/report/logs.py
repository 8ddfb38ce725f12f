"""``search logs``: a trial's own output (``user_attrs.log``), printed or followed.

The worker captures each trial's stdout and stderr into ``output.log`` in the trial's folder
(:mod:`search.tuning.output`); the study records that file's path on the trial when it starts.
The other processes of a data-parallel trial write beside it, rank ``N`` to
``output.rank<N>.log`` (:func:`search.compute.distributed.rank_log`): ``--rank N`` prints one.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from optuna.trial import TrialState

from search.compute.distributed import rank_log, rank_logs
from search.errors import SearchError, one_line
from search.tuning.output import LOG_FILE

if TYPE_CHECKING:
    import optuna

POLL_S = 0.5
"""How often ``--follow`` reads the file and the trial's state again."""


def _trial(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    """The study's trial ``number``, read afresh from the storage."""
    storage = study._storage
    try:
        trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    except KeyError:
        count = len(study.get_trials(deepcopy=False))
        raise SearchError(
            f"TRIAL: study {study.study_name!r} has no trial {number} (it has {count} trials, "
            f"numbered from 0)"
        ) from None
    return storage.get_trial(trial_id)


def log_path(study: optuna.Study, number: int, rank: int = 0) -> Path:
    """Where trial ``number``'s output is (its ``user_attrs.log``, or rank ``rank``'s file
    beside it), checked to be there.

    Raises:
        SearchError: The trial is not in the study, records no log, or its file is missing.
    """
    trial = _trial(study, number)
    path = trial.user_attrs.get("log")
    if not path:
        raise SearchError(
            f"trial {number} of study {study.study_name!r}: user_attrs.log is not set (the "
            "trial never started, or ran before trials recorded their output)"
        )
    if Path(path).name != LOG_FILE:  # the storage names it: a trial's output, or nothing
        raise SearchError(
            f"trial {number} of study {study.study_name!r}: user_attrs.log names "
            f"{one_line(repr(path))}, not a trial's {LOG_FILE}; it is not printed (whoever can "
            "write the storage sets the attribute)"
        )
    wanted = rank_log(path, rank)
    if rank and not wanted.is_file():
        found = ", ".join(str(r) for r in rank_logs(path))
        raise SearchError(
            f"--rank: trial {number} of study {study.study_name!r} has no output of rank "
            f"{rank} ({wanted.name} is not beside {Path(path).name}; ranks with output: "
            f"{found or 'none'})"
        )
    if not wanted.is_file():
        raise SearchError(
            f"{path}: trial {number}'s output file is not there (user_attrs.log names a file "
            "on the node that ran it)"
        )
    return wanted


def print_log(
    study: optuna.Study,
    number: int,
    *,
    follow: bool = False,
    rank: int = 0,
    out: IO[str] | None = None,
) -> None:
    """Prints trial ``number``'s output (rank ``rank``'s, in a data-parallel trial); with
    ``follow``, goes on printing what it writes until the study no longer holds the trial as
    RUNNING."""
    out = out or sys.stdout
    path = log_path(study, number, rank)
    with path.open(errors="replace") as file:
        while True:
            out.write(file.read())
            out.flush()
            if not follow:
                return
            if _trial(study, number).state != TrialState.RUNNING:
                out.write(file.read())  # what it wrote last, before it ended
                out.flush()
                return
            time.sleep(POLL_S)
