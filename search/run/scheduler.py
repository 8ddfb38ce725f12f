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

from search.run.moasha import MultiObjectiveASHA
from search.spec.derive import rung_epoch

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

    from search.spec.schema import StudySpec

TIME_ATTR = "training_iteration"
"""ASHA counts epochs: the runner reports exactly once per epoch."""


class PruneReportingASHA(AsyncHyperBandScheduler):
    """ASHA that calls ``on_prune(trial_id)`` when it stops a trial before ``max_t``.

    Args:
        on_prune: Receives the Ray trial id of every trial ASHA prunes.
        **kwargs: Passed to :class:`ray.tune.schedulers.AsyncHyperBandScheduler`.
    """

    def __init__(self, on_prune: Callable[[str], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._on_prune = on_prune

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

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        decision = super().on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.STOP and result.get(self._time_attr, 0) < self._max_t:
            self._on_prune(trial.trial_id)
        return decision


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
    )
