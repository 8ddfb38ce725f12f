"""TPE that proposes no config the study already holds, running or finished.

Without the constant liar, trials proposed while others run all see the same model, and on a
space of few values (``choice``, small ``int`` ranges) TPE's best candidate is often the
config that is already training: the trial is spent twice. With the liar, the running trials
count as bad results, which repels new proposals from the region the model likes: diversity by
pessimism, which over-explores when many trials run at once. :class:`DistinctTPESampler`
keeps TPE's ranking of its candidates and only passes over the ones that repeat a config the
study holds (the best fresh candidate wins; when every candidate repeats one, TPE's own
choice stands). It compares what TPE samples at once: the whole config with multivariate TPE,
one parameter's value with univariate TPE (``auto`` at K >= 8), which then passes over values
that parameter already has. On continuous spaces repeats do not happen and it samples as TPE
does.

Example:
    >>> import optuna
    >>> sampler = DistinctTPESampler(seed=0, n_startup_trials=2, constant_liar=False)
    >>> study = optuna.create_study(sampler=sampler)
    >>> study.optimize(lambda t: (t.suggest_int("x", 0, 5) - 3) ** 2, n_trials=6)
    >>> len({t.params["x"] for t in study.trials})
    6
"""

from __future__ import annotations

from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial

from search.record.sampling.history import BoundedTPESampler

_DIGITS = 9
"""Internal values equal to this many decimals are the same config."""


class DistinctTPESampler(BoundedTPESampler):
    """:class:`~search.record.sampling.history.BoundedTPESampler` whose pick skips candidates that
    repeat a config of the study (see the module's text); every other argument is TPE's.

    Args:
        thompson: Draw the pick among TPE's candidates with probability proportional to
            their density ratio ``l(x) / g(x)`` instead of taking the largest: each of K
            proposals made on one model lands elsewhere (a Thompson-sampling pick; TPE's own
            candidates are already drawn from ``l``).
    """

    def __init__(self, *args: Any, thompson: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._asking: tuple[optuna.Study, FrozenTrial] | None = None
        self._thompson = thompson

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, Any]
    ) -> dict[str, Any]:
        self._asking = (study, trial)
        return super().sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        self._asking = (study, trial)
        return super().sample_independent(study, trial, param_name, param_distribution)

    def _compute_acquisition_func(self, samples: dict[str, np.ndarray], *args: Any) -> np.ndarray:
        scores = np.asarray(super()._compute_acquisition_func(samples, *args), dtype=float)
        if self._thompson:  # Gumbel-max: TPE's argmax then draws with softmax(log ratio)
            scores = scores + self._rng.rng.gumbel(size=scores.shape)
        if self._asking is None or not samples:
            return scores
        held = _held(*self._asking, list(samples))
        names = list(samples)
        fresh = np.array(
            [
                tuple(round(float(samples[n][i]), _DIGITS) for n in names) not in held
                for i in range(len(scores))
            ]
        )
        return np.where(fresh, scores, -np.inf) if fresh.any() else scores


def _held(study: optuna.Study, trial: FrozenTrial, names: list[str]) -> set[tuple[float, ...]]:
    """The configs of ``study`` (every trial but ``trial``) on ``names``, as TPE's internal
    values: running ones carry their parameters from the moment they are asked."""
    held = set()
    for other in study._get_trials(deepcopy=False, use_cache=False):
        if other.number == trial.number or not set(names) <= other.params.keys():
            continue
        dists = other.distributions
        held.add(
            tuple(round(float(dists[n].to_internal_repr(other.params[n])), _DIGITS) for n in names)
        )
    return held
