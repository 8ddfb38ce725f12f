"""Optuna samplers from the spec's ``sampler`` block.

Ray ignores its own ``seed=`` when a sampler is passed, so the seed goes into the sampler.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import optuna
from optuna.trial import TrialState

from search.record.history import BoundedTPESampler
from search.record.resume import INTERRUPTED
from search.spec.space import grid

if TYPE_CHECKING:
    from search.spec.schema import StudySpec


class _Grid(optuna.samplers.GridSampler):
    """GridSampler without its ``study.stop()`` when the grid is used up, that runs an
    interrupted grid point again.

    Optuna's version calls ``study.stop()`` from ``after_trial``, which raises outside
    ``study.optimize`` and would leave the told trial RUNNING; the runner caps the trial
    budget at the grid's size instead (:func:`grid_size`). And it counts every finished trial's
    point as visited, so a point whose trial a dead driver left (FAIL, ``interrupted``) would
    never be run, and its replacement would run a visited point a second time.
    """

    def after_trial(self, *args: object, **kwargs: object) -> None:
        pass

    def _get_unvisited_grid_ids(self, study: optuna.Study) -> list[int]:
        visited, running = set(), set()
        for t in study._storage.get_all_trials(study._study_id, deepcopy=False):
            if "grid_id" not in t.system_attrs or not self._same_search_space(
                t.system_attrs["search_space"]
            ):
                continue
            if t.state.is_finished() and t.user_attrs.get("fail_reason") != INTERRUPTED:
                visited.add(t.system_attrs["grid_id"])
            elif t.state == TrialState.RUNNING:
                running.add(t.system_attrs["grid_id"])
        every = set(range(self._n_min_trials))
        return sorted(every - visited - running) or sorted(every - visited)


def grid_size(spec: StudySpec) -> int | None:
    """How many points the grid has, for the grid sampler; ``None`` for the others."""
    if spec.sampler.name != "grid":
        return None
    size = 1
    for values in grid(spec.space).values():
        size *= len(values)
    return size


def build_sampler(spec: StudySpec, offset: int = 0) -> optuna.samplers.BaseSampler:
    """The sampler the spec names, seeded with ``sampler.seed + offset`` (``offset``: the
    trials a resumed study already has, so it continues rather than replays its draws).

    TPE runs multivariate and grouped (conditional parameters get their own groups) with the
    constant liar, so trials proposed while others still run do not all pile onto one point;
    past :data:`~search.record.history.HISTORY_LIMIT` trials it models a bounded history.

    Example:
        >>> build_sampler(spec)  # doctest: +SKIP
        <search.record.history.BoundedTPESampler object at ...>
    """
    seed = None if spec.sampler.seed is None else spec.sampler.seed + offset
    name = spec.sampler.name
    if name == "tpe":
        with warnings.catch_warnings():  # group and constant_liar are "experimental" since 2.x
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return BoundedTPESampler(
                seed=seed, multivariate=True, group=True, constant_liar=True, n_startup_trials=8
            )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    return _Grid(grid(spec.space), seed=seed)
