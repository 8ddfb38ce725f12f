"""Optuna samplers from the spec's ``sampler`` block.

Ray ignores its own ``seed=`` when a sampler is passed, so the seed goes into the sampler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import optuna

from search.spec.space import grid

if TYPE_CHECKING:
    from search.spec.schema import StudySpec


class _Grid(optuna.samplers.GridSampler):
    """GridSampler without its ``study.stop()`` when the grid is used up.

    Optuna's version calls ``study.stop()`` from ``after_trial``, which raises outside
    ``study.optimize`` and would leave the told trial RUNNING; the runner caps the trial
    budget at the grid's size instead (:func:`grid_size`).
    """

    def after_trial(self, *args: object, **kwargs: object) -> None:
        pass


def grid_size(spec: StudySpec) -> int | None:
    """How many points the grid has, for the grid sampler; ``None`` for the others."""
    if spec.sampler.name != "grid":
        return None
    size = 1
    for values in grid(spec.space).values():
        size *= len(values)
    return size


def build_sampler(spec: StudySpec) -> optuna.samplers.BaseSampler:
    """The sampler the spec names, seeded.

    TPE runs multivariate and grouped (conditional parameters get their own groups) with the
    constant liar, so trials proposed while others still run do not all pile onto one point.

    Example:
        >>> build_sampler(spec)  # doctest: +SKIP
        <optuna.samplers._tpe.sampler.TPESampler object at ...>
    """
    seed = spec.sampler.seed
    name = spec.sampler.name
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True, constant_liar=True, n_startup_trials=8
        )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    return _Grid(grid(spec.space), seed=seed)
