"""A good start: configs the user trusts run first, and an earlier study's trials teach the
sampler before its first ask.

* ``sampler.start_from``: the first trials run these configs, in order, before the sampler
  proposes anything (the bridge fixes their parameters as Optuna's ``enqueue_trial`` does); a
  parameter a config leaves out is sampled. Their trials carry the user attribute
  :data:`START_FROM` (the config's index); one a dead driver interrupted is run again.
* ``warm_start: {study, storage}``: the COMPLETE trials of that study whose parameters all fit
  this spec's space are added to this study (Optuna's ``add_trials``) before the first ask,
  with their values and learning curves, so TPE models them and ASHA's rungs start filled.
  Each carries the user attribute :data:`IMPORTED` (``"<study>#<number>"``); they were not run
  here, so they never count against the trial budget (:func:`search.record.resume.recover`).

A warm start acts once, on a new study: a resumed study already holds its trials.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import check_distribution_compatibility
from optuna.trial import FixedTrial, FrozenTrial, TrialState, create_trial

from search.errors import SearchError
from search.record.resume import IMPORTED, interrupted
from search.record.storage import open_storage, redact
from search.record.study import directions
from search.specs.space import sample

if TYPE_CHECKING:
    from search.specs.schema import StudySpec

WARM_START = "warm_start"
"""Study user attribute: ``{"study", "trials"}``, the study warm-started from and the trials
copied (``"<study>#<number>"``)."""

START_FROM = "start_from"
"""Trial user attribute: the index in ``sampler.start_from`` of the config the trial ran."""


class WarmStartError(SearchError):
    """The ``warm_start`` study cannot seed this one (missing, or another direction)."""


def pending_start(study: optuna.Study, spec: StudySpec) -> list[tuple[int, dict[str, Any]]]:
    """The ``sampler.start_from`` configs no trial of the study has run yet, with their index
    (a trial the world cut does not count as run)."""
    done = {
        t.user_attrs[START_FROM]
        for t in study.get_trials(deepcopy=False)
        if START_FROM in t.user_attrs and not interrupted(t)
    }
    return [(i, dict(c)) for i, c in enumerate(spec.sampler.start_from) if i not in done]


def import_trials(study: optuna.Study, spec: StudySpec, source: str = "spec") -> list[str]:
    """Copies the ``warm_start`` study's fitting COMPLETE trials into a study without trials,
    and records them in the study's user attribute :data:`WARM_START`.

    Returns ``"<study>#<number>"`` of each trial copied.

    Raises:
        WarmStartError: See :func:`earlier_study`.
    """
    warm = spec.warm_start
    if warm is None or study.get_trials(deepcopy=False):
        return []
    earlier = earlier_study(spec, source)
    copies = []
    for trial in earlier.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        copy = _fitting_copy(trial, spec, f"{warm.study}#{trial.number}")
        if copy is not None:
            copies.append(copy)
    study.add_trials(copies)
    imported = [str(copy.user_attrs[IMPORTED]) for copy in copies]
    study.set_user_attr(WARM_START, {"study": warm.study, "trials": imported})
    return imported


def earlier_study(spec: StudySpec, source: str = "spec") -> optuna.Study:
    """The ``warm_start`` study (call it before creating this one: a missing study stops the
    run before anything is written).

    Raises:
        WarmStartError: It is not in its storage, or optimizes in other directions.
    """
    assert spec.warm_start is not None
    name, url = spec.warm_start.study, spec.warm_start.storage or spec.storage
    storage = open_storage(url)
    names = optuna.get_all_study_names(storage)
    if name not in names:
        raise WarmStartError(
            f"{source}: warm_start.study: {name!r} is not in {redact(url)} "
            f"(studies there: {', '.join(names) or 'none'})"
        )
    earlier = optuna.load_study(study_name=name, storage=storage)
    was = [d.name.lower() for d in earlier.directions]
    if was != directions(spec):
        raise WarmStartError(
            f"{source}: warm_start.study: {name!r} optimizes {', '.join(was)}, this spec "
            f"{', '.join(directions(spec))}; warm-start from a study of the same objectives"
        )
    return earlier


def _fitting_copy(trial: FrozenTrial, spec: StudySpec, origin: str) -> FrozenTrial | None:
    """``trial`` as a COMPLETE trial of this spec's space, or ``None`` where it does not fit:
    another set of active parameters, a value out of range, or another distribution."""
    fixed = FixedTrial(dict(trial.params))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # FixedTrial only warns of a value out of range
            active = sample(fixed, spec.space)  # type: ignore[arg-type]
    except (ValueError, UserWarning):
        return None
    if not active or set(fixed.params) != set(trial.params):  # fixed params are not searched
        return None
    distributions: dict[str, Any] = fixed.distributions
    for name, new in distributions.items():
        try:
            check_distribution_compatibility(trial.distributions[name], new)
        except ValueError:
            return None
    return create_trial(
        params=dict(trial.params),
        distributions=distributions,
        values=list(trial.values),
        intermediate_values=dict(trial.intermediate_values),
        user_attrs={IMPORTED: origin},
        state=TrialState.COMPLETE,
    )
