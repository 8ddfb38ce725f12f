"""The early-stopping scheduler: ASHA across the whole study, telling the bridge what it pruned.

Ray's ASHA decides well but says nothing about why a trial stopped: a stop at ``max_t`` (the
trial is done) and a stop at a rung (the trial is pruned) look the same to the searcher. This
subclass reports the second kind, so the study can record PRUNED truthfully.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, TrialScheduler

from search.specs.derive import rung_epoch
from search.tuning.moasha import MultiObjectiveASHA

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

    from search.specs.schema import StudySpec

TIME_ATTR = "training_iteration"
"""ASHA counts epochs: the runner reports exactly once per epoch."""


class PruneReportingASHA(AsyncHyperBandScheduler):
    """ASHA that calls ``on_prune(trial_id)`` when it stops a trial before ``max_t``.

    With ``recheck``, a trial is also held to its last rung after it passed it: Ray's ASHA
    compares a trial with a rung once, when it arrives, so the first arrivals pass with nothing
    to compare against and run on to the next rung whatever the later arrivals show. Rechecked,
    a trial whose value at its last rung has fallen below that rung's cutoff (the top
    ``1/reduction_factor`` of every value the rung now holds, its own included) is stopped at
    its next epoch, as synchronous successive halving would have stopped it.

    Args:
        on_prune: Receives the Ray trial id of every trial ASHA prunes.
        recheck: Hold trials to their last rung at every epoch, not only on arrival.
        **kwargs: Passed to :class:`ray.tune.schedulers.AsyncHyperBandScheduler`.

    Example:
        >>> from types import SimpleNamespace as T
        >>> asha = PruneReportingASHA(print, recheck=True, time_attr="epoch", metric="acc",
        ...                           mode="max", max_t=9, grace_period=1, reduction_factor=3)
        >>> for name in "ab":
        ...     asha.on_trial_add(None, T(trial_id=name))
        >>> asha.on_trial_result(None, T(trial_id="a"), {"epoch": 1, "acc": 0.1})  # first: passes
        'CONTINUE'
        >>> asha.on_trial_result(None, T(trial_id="b"), {"epoch": 1, "acc": 0.9})
        'CONTINUE'
        >>> asha.on_trial_result(None, T(trial_id="a"), {"epoch": 2, "acc": 0.2})  # now behind
        a
        'STOP'
        >>> asha.on_trial_add(None, T(trial_id="c"))
        >>> asha.on_trial_result(None, T(trial_id="c"), {"epoch": 1, "acc": float("nan")})
        'CONTINUE'
        >>> "c" in asha._brackets[0]._rungs[-1][1]  # a failing epoch is no rung value
        False
    """

    def __init__(
        self, on_prune: Callable[[str], None], recheck: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._on_prune = on_prune
        self._recheck = recheck

    def restore_rungs(self, curves: Iterable[Mapping[int, float]]) -> int:
        """Refills the rungs with earlier trials' values at each milestone (for a resume).

        Returns how many rung entries were restored. Non-finite values are skipped.
        """
        restored = 0
        for index, curve in enumerate(curves):
            for bracket in self._brackets:
                for milestone, recorded in bracket._rungs:
                    value = curve.get(rung_epoch(milestone))
                    if value is not None and math.isfinite(value):
                        recorded[f"earlier-{index}"] = (self._metric_op or 1.0) * value
                        restored += 1
        return restored

    def _failing(self, result: Mapping[str, Any]) -> bool:
        """Whether ``result`` is a failing epoch (the worker's NaN stand-in for a missing
        objective, a diverged one): the trial ends with it, so it is no rung value. Recorded,
        such values left rungs of NaN only, on which NumPy's ``nanpercentile`` warns
        "All-NaN slice encountered" (and they never moved a cutoff)."""
        value = result.get(self._metric or "")
        return isinstance(value, float) and not math.isfinite(value)

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        if self._failing(result):
            self._trial_info.pop(trial.trial_id, None)
            return
        super().on_trial_complete(tune_controller, trial, result)

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        if self._failing(result):
            return TrialScheduler.CONTINUE
        decision = super().on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.CONTINUE and self._recheck and self._behind(trial, result):
            decision = TrialScheduler.STOP
            self._num_stopped += 1
        if decision == TrialScheduler.STOP and result.get(self._time_attr, 0) < self._max_t:
            self._on_prune(trial.trial_id)
        return decision

    def _behind(self, trial: Trial, result: Mapping[str, Any]) -> bool:
        """Whether the trial's value at its last rung, passed before this result, is now below
        that rung's cutoff."""
        epoch, bracket = result.get(self._time_attr), self._trial_info.get(trial.trial_id)
        if bracket is None or epoch is None or self._metric not in result:
            return False
        for milestone, recorded in bracket._rungs:  # highest first
            if trial.trial_id in recorded:
                if epoch <= rung_epoch(milestone):  # arrived with this result: Ray decided
                    return False
                cutoff = bracket.cutoff(recorded)
                return cutoff is not None and recorded[trial.trial_id] < cutoff
        return False


def build_scheduler(spec: StudySpec, on_prune: Callable[[str], None]) -> TrialScheduler:
    """ASHA from the spec's ``asha`` block (MO-ASHA with several objectives), or
    first-in-first-out when it is disabled."""
    if not spec.asha.enabled:
        return FIFOScheduler()
    if spec.multi_objective:
        return MultiObjectiveASHA(
            on_prune,
            metrics=[o.metric for o in spec.objectives],
            modes=[o.mode for o in spec.objectives],
            time_attr=TIME_ATTR,
            max_t=spec.budget.max_epochs,
            grace_period=spec.asha.grace_period,
            reduction_factor=spec.asha.reduction_factor,
        )
    return PruneReportingASHA(
        on_prune,
        time_attr=TIME_ATTR,
        metric=spec.primary.metric,
        mode=spec.primary.mode,
        max_t=spec.budget.max_epochs,
        grace_period=spec.asha.grace_period,
        reduction_factor=spec.asha.reduction_factor,
        brackets=spec.asha.brackets,
        recheck=spec.asha.recheck,
    )
