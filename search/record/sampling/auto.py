"""``sampler: {name: auto}``: TPE set for the number of trials that run at once, K.

One trial at a time, TPE is at its best as the project pins it (multivariate, grouped, ten
random configs first, the constant liar): ``auto`` is exactly that TPE at K = 1. With K
trials at once, each proposal is made while K - 1 others run, and three things go wrong
(``benchmarks/sampler_settings.py`` measures each, and the docs' search-quality page says
what each part of the plan buys):

- the constant liar counts every running trial as a bad result; with K - 1 of them in the
  region the model likes, the next proposal is pushed out of it (over-exploration). Here
  running trials are not lied about; a proposal skips configs the study already holds and
  draws its pick among TPE's candidates in proportion to their density ratio, so K proposals
  made on one model land apart (:mod:`search.record.sampling.distinct`);
- from K = 8 on (:data:`MANY_FROM`), the joint model loses to univariate TPE, and the first
  K configs, proposed before any result, are independent random draws, with about a quarter
  of the first 100 at K = 16 (Optuna counts only *finished* trials towards
  ``n_startup_trials``). There the start is a space-filling batch of ``max(K, 10)``
  (:mod:`search.record.sampling.spacefill`), and the model takes over once one trial has finished;
- the sampler is built before the runner knows K: :meth:`AutoSampler.configure` takes it
  before the first ask, and the study records the :class:`Plan` it chose.

Example:
    >>> plan_for(1).constant_liar, plan_for(4).constant_liar, plan_for(4).thompson
    (True, False, True)
    >>> plan_for(16).multivariate, plan_for(16).spacefill, plan_for(16).start
    (False, True, 16)
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from search.record.sampling.distinct import DistinctTPESampler
from search.record.sampling.history import BoundedTPESampler
from search.record.sampling.spacefill import SpaceFilling

PARALLEL_FROM = 2
"""The concurrency from which :func:`plan_for` chooses the parallel plan."""
MANY_FROM = 8
"""The concurrency from which TPE models each parameter on its own and the first batch is
space-filling."""


@dataclass(frozen=True)
class Plan:
    """How :class:`AutoSampler` proposes, for ``concurrency`` trials at once.

    Args:
        concurrency: Trials at once the plan was chosen for.
        start: Configs proposed before the model: the first ``start`` asked, and every one
            asked while no trial has finished.
        spacefill: The start's configs are space-filling (Sobol) rather than random, and the
            model takes over once one trial has finished (else: once ``start`` have).
        multivariate: TPE models the parameters jointly (else one by one).
        constant_liar: TPE counts running trials as bad results.
        distinct: TPE skips candidates that repeat a config of the study.
        thompson: TPE draws its pick in proportion to the density ratio
            (:class:`~search.record.sampling.distinct.DistinctTPESampler`).
    """

    concurrency: int
    start: int
    spacefill: bool
    multivariate: bool
    constant_liar: bool
    distinct: bool
    thompson: bool


def plan_for(concurrency: int, n_startup_trials: int = 10) -> Plan:
    """The plan for ``concurrency`` trials at once (see the module's text)."""
    if concurrency < PARALLEL_FROM:
        return Plan(concurrency, n_startup_trials, False, True, True, False, False)
    if concurrency < MANY_FROM:
        return Plan(concurrency, n_startup_trials, False, True, False, True, True)
    return Plan(concurrency, max(concurrency, n_startup_trials), True, False, False, True, True)


class AutoSampler(BaseSampler):
    """TPE with the :class:`Plan` of :func:`plan_for` (the module's text says why).

    Args:
        names: The space's parameters, in order (the start's dimensions).
        seed: Seeds the start and TPE.
        tpe_args: TPE's pinned arguments (``constant_liar`` and ``n_startup_trials`` come
            from the plan).
        concurrency: Trials at once, until :meth:`configure` says otherwise.
    """

    def __init__(
        self,
        names: Sequence[str],
        seed: int | None,
        tpe_args: dict[str, Any],
        concurrency: int = 1,
    ) -> None:
        self._names, self._seed, self._tpe_args = list(names), seed, dict(tpe_args)
        self._fill = SpaceFilling(self._names, seed)
        self._starting: set[int] = set()  # the trials the start proposes
        self._informed = False  # a trial has finished: the model may take over
        self.configure(concurrency)

    def configure(self, concurrency: int) -> Plan:
        """Chooses the plan for ``concurrency`` trials at once; call before the first ask."""
        startup = int(self._tpe_args.get("n_startup_trials", 10))
        return self.use(plan_for(max(1, concurrency), startup))

    def use(self, plan: Plan) -> Plan:
        """Proposes by ``plan`` from the next ask on (:meth:`configure` chooses one; a
        benchmark can compare others)."""
        self.plan = plan
        args = {**self._tpe_args, "constant_liar": plan.constant_liar}
        if not plan.multivariate:
            args.update(multivariate=False, group=False)  # group needs multivariate
        if plan.spacefill:
            args["n_startup_trials"] = 0  # the start below decides when TPE takes over
        with warnings.catch_warnings():  # group and constant_liar are "experimental"
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            model: BaseSampler
            if plan.distinct:
                model = DistinctTPESampler(seed=self._seed, thompson=plan.thompson, **args)
            else:
                model = BoundedTPESampler(seed=self._seed, **args)
        self._model = model
        return plan

    def describe(self) -> dict[str, Any]:
        """What the study records of the plan (the ``sampler`` user attribute's ``plan``)."""
        return asdict(self.plan)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if self.plan.spacefill and not self._informed:
            self._informed = _finished(study)
        if self.plan.spacefill and (trial.number < self.plan.start or not self._informed):
            self._starting.add(trial.number)
        self._model.before_trial(study, trial)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        if trial.number in self._starting:
            return {}
        return self._model.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if trial.number in self._starting:
            return {}
        return self._model.sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        if trial.number in self._starting:
            return self._fill.value(trial.number, param_name, param_distribution)
        return self._model.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._starting.discard(trial.number)
        self._model.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._model.reseed_rng()


def _finished(study: optuna.Study) -> bool:
    """Whether a trial of ``study`` has finished with a value TPE models."""
    states = (TrialState.COMPLETE, TrialState.PRUNED)
    return bool(study._get_trials(deepcopy=False, states=states, use_cache=False))
