"""Opening Optuna studies: create one for a spec, or load an existing one by name."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import optuna

from search.errors import SearchError
from search.record.folders import study_folder
from search.record.lease import StudyLease
from search.record.sampling.samplers import SAMPLER, build_sampler, describe
from search.record.storage import open_storage, redact, redacted_spec
from search.specs.derive import incompatible_change
from search.specs.schema import parse_spec

if TYPE_CHECKING:
    from search.specs.schema import StudySpec

CONFIRM_SUFFIX = "-confirm"
"""The confirmation runs of study ``X`` are the trials of study ``X-confirm``."""
CONFIRM_FILE = "confirm.db"
"""Where they are: ``<results>/<X>/confirm.db``, a SQLite storage apart from the study's.
optuna-dashboard lists every study of the storage it serves, flat (0.21: no grouping by name
or attribute); kept apart, the confirmation studies no longer sit beside the user's."""


def confirm_storage(results_dir: Path, study_name: str) -> str:
    """The URL of the storage of ``study_name``'s confirmation runs (:data:`CONFIRM_FILE`).

    Example:
        >>> confirm_storage(Path("/r"), "cnn")
        'sqlite:////r/cnn/confirm.db'
    """
    return f"sqlite:///{(study_folder(results_dir, study_name) / CONFIRM_FILE).resolve()}"


class StudyNotFoundError(SearchError):
    """No study of that name in the storage."""


class SpecMismatchError(SearchError):
    """A resumed study's spec changes what its trials mean (objective, space, ...)."""


def open_study(spec: StudySpec, restart: bool = False, source: str = "spec") -> optuna.Study:
    """Creates the spec's study, or loads it to resume; writes nothing on an existing study.

    A resumed study continues its sampler's stream (seed + the trials it has) rather than
    replaying the first run's configs.

    Args:
        spec: The validated spec.
        restart: Delete an existing study of that name first and start afresh (refused while
            a live driver holds it).
        source: Where the spec came from, for error lines.

    Raises:
        SpecMismatchError: When resuming with a spec that changes the objective, the space or
            another field of :data:`search.specs.derive.FIXED_FIELDS`.
        StudyBusyError: When ``restart`` would delete a study a live driver holds.
    """
    storage = open_storage(spec.storage)
    # Names only: a summary of every study reads every trial of every study (seconds at 10k).
    found = spec.study in optuna.get_all_study_names(storage)
    if restart and found:
        lease = StudyLease(spec.storage, spec.study, "restart")
        lease.acquire()  # refuses while a live driver holds the study
        lease.release()
        optuna.delete_study(study_name=spec.study, storage=storage)
        found = False
    done, stored = 0, None
    if found:
        existing = optuna.load_study(study_name=spec.study, storage=storage)
        _check_resumable(existing, spec, source)
        done = len(existing.get_trials(deepcopy=False))
        stored = stored_sampler_args(existing, spec)
    study = optuna.create_study(
        study_name=spec.study,
        storage=storage,
        sampler=build_sampler(spec, offset=done, stored=stored),
        directions=directions(spec),
        load_if_exists=True,
    )
    names = [o.metric for o in spec.objectives]
    if study.metric_names != names:  # what optuna-dashboard labels the objectives with
        with warnings.catch_warnings():  # set_metric_names is "experimental" since 3.2
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(names)
    return study


def directions(spec: StudySpec) -> list[Literal["minimize", "maximize"]]:
    """Optuna's direction of each of ``spec``'s objectives.

    Example:
        >>> from search.specs.schema import parse_spec
        >>> two = [{"metric": "acc", "mode": "max"}, {"metric": "latency_ms", "mode": "min"}]
        >>> spec = parse_spec({"study": "s", "trainable": "search.testing:curve", "objective": two})
        >>> directions(spec)
        ['maximize', 'minimize']
    """
    return ["maximize" if o.mode == "max" else "minimize" for o in spec.objectives]


def _check_resumable(summary: optuna.Study, spec: StudySpec, source: str) -> None:
    flag = "restart=True" if source == "search.run" else "--restart"  # the Python door's
    how = f"pass {flag} to start study {spec.study!r} afresh, or give the study a new name"
    stored = summary.user_attrs.get("spec")
    change = incompatible_change(stored, spec) if isinstance(stored, dict) else None
    stored_directions = [d.name.lower() for d in summary.directions]
    if change is None and stored_directions != directions(spec):
        was, now = ", ".join(stored_directions), ", ".join(directions(spec))
        change = f"objective: the study's directions are {was}, the spec's {now}"
    if change is not None:
        raise SpecMismatchError(
            f"{source}: {change}: study {spec.study!r} was run with another spec; {how}"
        )


def stored_sampler_args(study: optuna.Study, spec: StudySpec) -> dict[str, Any] | None:
    """The arguments the study's sampler was first built with (user attribute ``sampler``),
    when it is the sampler the spec names."""
    stored = study.user_attrs.get(SAMPLER)
    if isinstance(stored, dict) and stored.get("name") == spec.sampler.name:
        return dict(stored.get("args") or {})
    return None


def record_spec(study: optuna.Study, spec: StudySpec) -> None:
    """Stores ``spec`` (password redacted) on ``study``; a changed one (more trials, a longer
    time limit) is added to the history in the user attribute ``spec_history``. The sampler's
    every argument goes into the user attribute ``sampler`` (:func:`describe`), once per
    sampler: a resume keeps what the first run used."""
    described, old = describe(spec, stored_sampler_args(study, spec)), study.user_attrs.get(SAMPLER)
    if not isinstance(old, dict) or [old.get("name"), old.get("args")] != [
        described["name"],
        described["args"],
    ]:
        study.set_user_attr(SAMPLER, described)
    new = redacted_spec(spec.to_dict())
    old = study.user_attrs.get("spec")
    if isinstance(old, dict) and old != new:
        changed = {k: [old.get(k), v] for k, v in new.items() if old.get(k) != v}
        history = list(study.user_attrs.get("spec_history", []))
        history.append({"at": datetime.now(UTC).isoformat(timespec="seconds"), "changed": changed})
        study.set_user_attr("spec_history", history)
    study.set_user_attr("spec", new)


class NoSpecError(SearchError):
    """The study holds no spec: it was not made by ``search run``."""


@overload
def stored_spec(
    study: optuna.Study,
    storage: str | None = None,
    *,
    find_code: bool = False,
    required: Literal[False] = False,
) -> StudySpec | None: ...


@overload
def stored_spec(
    study: optuna.Study,
    storage: str | None = None,
    *,
    find_code: bool = False,
    required: Literal[True],
) -> StudySpec: ...


def stored_spec(
    study: optuna.Study,
    storage: str | None = None,
    *,
    find_code: bool = False,
    required: bool = False,
) -> StudySpec | None:
    """The spec ``search run`` recorded on ``study`` (:func:`record_spec`), typed: the one
    reader of it, for the report (which shows a study) and ``export`` (which runs its code).

    Args:
        study: The study.
        storage: The real storage URL, in place of the redacted one stored; ``None`` keeps that.
        find_code: Whether to check that its trainable's module can be found (``export``
            does; reading a study to show it imports none of its code).
        required: Whether a study without a spec is an error (``export``, ``register``)
            rather than ``None`` (the report shows any Optuna study).

    Returns:
        The spec, or ``None`` when the study holds none (it was not made by ``search run``).

    Raises:
        SpecError: When the stored spec is not one this version reads.
        NoSpecError: With ``required``, when the study holds none.

    Example:
        >>> stored_spec(optuna.create_study()) is None
        True
        >>> stored_spec(optuna.create_study(study_name="x"), required=True)
        Traceback (most recent call last):
        ...
        search.record.study.NoSpecError: study 'x' has no spec (user attribute 'spec'); ...
    """
    data = study.user_attrs.get("spec")
    if not isinstance(data, dict):
        if required:
            raise NoSpecError(
                f"study {study.study_name!r} has no spec (user attribute 'spec'); only "
                "studies made by 'python -m search run' can be exported"
                + (
                    ""
                    if study.trials
                    else " (a run that failed before its first trial leaves such a study: "
                    "run it again)"
                )
            )
        return None
    if storage is not None:
        data = {**data, "storage": storage}
    return parse_spec(data, f"study {study.study_name!r}: spec", find_code=find_code)


def load_study(name: str, storage_url: str) -> optuna.Study:
    """Loads an existing study.

    Raises:
        StudyNotFoundError: Naming the studies the storage does have.
    """
    storage = open_storage(storage_url)
    names = optuna.get_all_study_names(storage)
    if name not in names:
        known = ", ".join(names) or "none"
        raise StudyNotFoundError(
            f"study {name!r} is not in {redact(storage_url)} (studies there: {known})"
        )
    return optuna.load_study(study_name=name, storage=storage)
