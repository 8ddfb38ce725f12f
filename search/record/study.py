"""Opening Optuna studies: create one for a spec, or load an existing one by name."""

from __future__ import annotations

from typing import TYPE_CHECKING

import optuna

from search.errors import SearchError
from search.record.samplers import build_sampler
from search.record.storage import open_storage, redact

if TYPE_CHECKING:
    from search.spec.schema import StudySpec

CONFIRM_SUFFIX = "-confirm"
"""The confirmation runs of study ``X`` are the trials of study ``X-confirm``."""


class StudyNotFoundError(SearchError):
    """No study of that name in the storage."""


def open_study(spec: StudySpec, restart: bool = False) -> optuna.Study:
    """Creates (or loads) the spec's study and records the spec on it, password redacted.

    Args:
        spec: The validated spec.
        restart: Delete an existing study of that name first and start afresh.
    """
    storage = open_storage(spec.storage)
    if restart and spec.study in [s.study_name for s in optuna.get_all_study_summaries(storage)]:
        optuna.delete_study(study_name=spec.study, storage=storage)
    study = optuna.create_study(
        study_name=spec.study,
        storage=storage,
        sampler=build_sampler(spec),
        direction="maximize" if spec.objective.mode == "max" else "minimize",
        load_if_exists=True,
    )
    study.set_user_attr("spec", spec.to_dict() | {"storage": redact(spec.storage)})
    return study


def load_study(name: str, storage_url: str) -> optuna.Study:
    """Loads an existing study.

    Raises:
        StudyNotFoundError: Naming the studies the storage does have.
    """
    storage = open_storage(storage_url)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if name not in names:
        known = ", ".join(names) or "none"
        raise StudyNotFoundError(
            f"study {name!r} is not in {redact(storage_url)} (studies there: {known})"
        )
    return optuna.load_study(study_name=name, storage=storage)
