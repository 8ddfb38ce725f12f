"""Optuna samplers from the spec's ``sampler`` block.

Ray ignores its own ``seed=`` when a sampler is passed, so the seed goes into the sampler.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from search.record.resume import interrupted
from search.record.sampling.auto import AutoSampler
from search.record.sampling.history import BoundedTPESampler
from search.specs.pinned import PINNED
from search.specs.space import grid, order

if TYPE_CHECKING:
    from search.specs.schema import StudySpec

SAMPLER = "sampler"
"""Study user attribute: the sampler's name, seed, every argument, the Optuna version that
first ran it (:func:`describe`), and an ``auto`` sampler's plan (:func:`configure`)."""


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
            if t.state.is_finished() and not interrupted(t):
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


def sampler_args(spec: StudySpec, stored: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every argument the spec's sampler is built with (its seed aside): the pinned ones
    (:data:`~search.specs.pinned.PINNED`), then those ``stored`` on the study when it was
    created (a resume samples as the first run did), then the spec's ``sampler.args``.

    Example:
        >>> sampler_args(spec)["n_startup_trials"]  # doctest: +SKIP
        10
    """
    pinned = PINNED.get(spec.sampler.name, {})
    earlier = {k: v for k, v in (stored or {}).items() if k in pinned}
    return {**pinned, **earlier, **spec.sampler.args}


def build_sampler(
    spec: StudySpec, offset: int = 0, stored: Mapping[str, Any] | None = None
) -> optuna.samplers.BaseSampler:
    """The sampler the spec names, seeded with ``sampler.seed + offset`` (``offset``: the
    trials a resumed study already has, so it continues rather than replays its draws), with
    the arguments of :func:`sampler_args`.

    TPE runs multivariate and grouped (conditional parameters get their own groups) with the
    constant liar, so trials proposed while others still run do not all pile onto one point;
    past :data:`~search.record.sampling.history.HISTORY_LIMIT` trials it models a bounded history.
    ``auto`` is TPE with the plan for one trial at a time until :func:`configure` gives it
    the run's concurrency (:mod:`search.record.sampling.auto`).

    Example:
        >>> build_sampler(spec)  # doctest: +SKIP
        <search.record.sampling.history.BoundedTPESampler object at ...>
    """
    seed = None if spec.sampler.seed is None else spec.sampler.seed + offset
    name, args = spec.sampler.name, sampler_args(spec, stored)
    if name == "auto":
        searched = [n for n in order(spec.space) if spec.space[n].kind != "fixed"]
        return AutoSampler(searched, seed, args)
    if name == "tpe":
        with warnings.catch_warnings():  # group and constant_liar are "experimental" since 2.x
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return BoundedTPESampler(seed=seed, **args)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False, **args)
    return _Grid(grid(spec.space), seed=seed)


def configure(study: optuna.Study, concurrency: int) -> None:
    """Tells the study's sampler how many trials run at once, before its first ask; an
    ``auto`` sampler chooses its plan for it, and the study records the plan (user attribute
    ``sampler``, key ``plan``: a resume on another cluster records its own)."""
    sampler = study.sampler
    if not isinstance(sampler, AutoSampler):
        return
    sampler.configure(concurrency)
    plan = sampler.describe()
    described = dict(study.user_attrs.get(SAMPLER) or {})
    if described.get("plan") != plan:
        study.set_user_attr(SAMPLER, {**described, "plan": plan})


def describe(spec: StudySpec, stored: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the study records of its sampler (user attribute ``sampler``): its name, seed,
    every argument, and the Optuna version that first ran it."""
    return {
        "name": spec.sampler.name,
        "seed": spec.sampler.seed,
        "args": sampler_args(spec, stored),
        "optuna": optuna.__version__,
    }
