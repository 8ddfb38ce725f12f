"""Which configs ``export`` confirms, with which seeds (step 1 of ``export``).

The candidates are the best COMPLETE trials on the primary (first) objective, duplicates of
the same parameters dropped; with several objectives, the Pareto front's trials only. A study
without a COMPLETE trial is refused in one line. The seeds are fresh: none of them is a seed
the search used, so the confirmation measures the config, not a lucky draw.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from search.contract import declarations
from search.handover.train import ExportError
from search.record.queries import pareto_trials

if TYPE_CHECKING:
    import optuna

    from search.specs.schema import StudySpec

CONFIRM_SEED_OFFSET = 1_000_000
"""Confirmation seeds start here above the sampler's seed; search trial ``n`` used seed + n."""


@dataclass(frozen=True)
class Candidate:
    """One COMPLETE search trial that goes to confirmation."""

    number: int
    value: float
    params: dict[str, Any]
    distributions: dict[str, Any]


def candidates(study: optuna.Study, top_k: int) -> list[Candidate]:
    """The ``top_k`` best COMPLETE trials with finite values, distinct parameters.

    "Best" is on the primary (first) objective. With several objectives the candidates are
    the Pareto front's trials (:func:`search.record.queries.pareto_trials`), so a plain
    export of such a study hands over the front's best on the primary objective.

    Raises:
        ExportError: When the study has no COMPLETE trial.
    """
    from optuna.study import StudyDirection

    done = complete_trials(study)
    if len(study.directions) > 1:
        front = {t.number for t in pareto_trials(study)}
        done = [t for t in done if t.number in front]
    sign = -1.0 if study.directions[0] == StudyDirection.MAXIMIZE else 1.0
    done.sort(key=lambda t: (sign * primary_value(t), t.number))
    chosen: list[Candidate] = []
    seen: set[str] = set()
    for trial in done:
        key = json.dumps(trial.params, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        chosen.append(as_candidate(trial))
        if len(chosen) == top_k:
            break
    return chosen


def complete_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The COMPLETE trials whose every objective value is finite.

    Raises:
        ExportError: When there is none.
    """
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    done = [
        t
        for t in trials
        if t.state == TrialState.COMPLETE
        and t.values
        and all(v is not None and math.isfinite(v) for v in t.values)
    ]
    if not done:
        counts = {s: sum(t.state.name == s for t in trials) for s in ("PRUNED", "FAIL")}
        raise ExportError(
            f"study {study.study_name!r} has no COMPLETE trial to export ({len(trials)} trials: "
            f"{counts['PRUNED']} pruned, {counts['FAIL']} failed); run more trials first"
        )
    return done


def primary_value(trial: optuna.trial.FrozenTrial) -> float:
    """The trial's value on the first objective (its only one, with a single objective)."""
    return float(trial.values[0])


def as_candidate(trial: optuna.trial.FrozenTrial) -> Candidate:
    """``trial`` as a confirmation candidate (its value: the primary objective's)."""
    return Candidate(
        trial.number, primary_value(trial), dict(trial.params), dict(trial.distributions)
    )


def confirmation_seeds(spec: StudySpec, count: int) -> list[int]:
    """``count`` seeds no search trial used (trial ``n`` trains with ``sampler.seed + n``)."""
    base = (spec.sampler.seed or 0) + CONFIRM_SEED_OFFSET
    return [base + j for j in range(count)]


def resolved_config(spec: StudySpec, params: Mapping[str, Any]) -> dict[str, Any]:
    """``fixed`` and ``params``, plus every other knob the trainable reads at its default.

    The defaults come from the trainable's ``@trainable(defaults=...)`` when it has them, so the
    exported config does not depend on defaults that a later version might change.
    """
    plain = (str, int, float, bool, type(None))
    defaults = declarations(spec.trainable).defaults or {}
    known = {k: v for k, v in defaults.items() if isinstance(v, plain)}
    return {**known, **spec.fixed, **params}
