"""MO-ASHA: asynchronous successive halving that weighs several objectives at once.

Ray's ASHA ranks a rung's results by one number. With several objectives (accuracy up, latency
down) there is no one number, so MO-ASHA (Schmucker et al., 2021; Syne Tune's ``MOASHA``) ranks
a rung by Pareto front and, within a front, by crowding distance (:mod:`search.record.pareto`).

Everything else is Ray's single-bracket ASHA, kept on purpose so that one objective decides
exactly as :class:`~search.tuning.scheduler.PruneReportingASHA` does: the same milestones, the
same moment (a trial's first result at or past a milestone it has no entry at, the highest
such), the same cutoff (the ``1 - 1/reduction_factor`` percentile, interpolated, of the scores
the rung recorded before; no entry yet means continue) and the same tie rule (a score equal to
the cutoff continues). A score is the signed value with one objective and, with several, minus
how many of the rung's results rank strictly ahead (identical vectors tie). A vector with a
missing or non-finite value scores ``-inf``: it ranks last, and it is recorded.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from search.record.pareto import rank_keys
from search.specs.derive import ray_milestones, rung_epoch

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

Vector = tuple[float, ...]


def rung_scores(vectors: Sequence[Vector], modes: Sequence[str]) -> list[float]:
    """Each vector's score at a rung, higher is better (see the module's docstring).

    Example:
        >>> rung_scores([(0.5,), (0.7,), (float("nan"),)], ["max"])
        [0.5, 0.7, -inf]
        >>> rung_scores([(0.9, 30.0), (0.8, 10.0), (0.7, 40.0), (0.9, 30.0)], ["max", "min"])
        [0.0, 0.0, -3.0, 0.0]
    """
    finite = [all(math.isfinite(v) for v in vector) for vector in vectors]
    if len(modes) == 1:
        sign = 1.0 if modes[0] == "max" else -1.0
        return [sign * v[0] if ok else -math.inf for v, ok in zip(vectors, finite, strict=True)]
    keys = rank_keys(vectors, modes)
    ahead = sorted(keys)  # a score is minus how many keys are strictly better
    scores = [0.0 - bisect.bisect_left(ahead, key) for key in keys]
    return [s if ok else -math.inf for s, ok in zip(scores, finite, strict=True)]


def continues(recorded: Sequence[Vector], vector: Vector, modes: Sequence[str], rf: float) -> bool:
    """Whether a trial reaching a rung with ``vector`` goes on, given what the rung ``recorded``.

    Example:
        >>> continues([(0.0,), (10.0,)], (5.0,), ["max"], 3)  # ASHA's cutoff: 6.67
        False
        >>> continues([(0.0,), (10.0,)], (7.0,), ["max"], 3)
        True
    """
    if not recorded:
        return True
    *earlier, score = rung_scores([*recorded, vector], modes)
    with np.errstate(invalid="ignore"):  # -inf scores: the cutoff may come out nan
        cutoff = np.nanpercentile(earlier, (1 - 1 / rf) * 100)
    return not score < cutoff  # a nan cutoff stands for -inf: everyone continues


class MultiObjectiveASHA(FIFOScheduler):
    """ASHA over several objectives; calls ``on_prune(trial_id)`` when it stops a trial before
    ``max_t``. A trial reaching ``max_t`` is stopped without it.

    Args:
        on_prune: Receives the Ray trial id of every trial stopped at a rung.
        metrics: The objectives: keys of a trial's results.
        modes: ``"max"`` or ``"min"``, one per metric.
        time_attr: The result key that counts progress (epochs here).
        max_t: The progress at which every trial stops.
        grace_period: The first milestone.
        reduction_factor: Milestones grow by this factor; a rung keeps the top ``1/rf``.

    Example:
        >>> from types import SimpleNamespace
        >>> pruned: list[str] = []
        >>> asha = MultiObjectiveASHA(pruned.append, ["acc", "ms"], ["max", "min"], max_t=9)
        >>> for name, acc, ms in [("a", 0.9, 30.0), ("b", 0.8, 10.0), ("c", 0.7, 40.0)]:
        ...     result = {"training_iteration": 1, "acc": acc, "ms": ms}
        ...     asha.on_trial_result(None, SimpleNamespace(trial_id=name), result)
        'CONTINUE'
        'CONTINUE'
        'STOP'
        >>> pruned
        ['c']
    """

    def __init__(
        self,
        on_prune: Callable[[str], None],
        metrics: Sequence[str],
        modes: Sequence[str],
        time_attr: str = "training_iteration",
        max_t: float = 100,
        grace_period: float = 1,
        reduction_factor: float = 3,
    ) -> None:
        if not metrics or len(modes) != len(metrics) or set(modes) - {"max", "min"}:
            raise ValueError(f"need one mode, 'max' or 'min', per metric; got {modes}, {metrics}")
        if not 0 < grace_period <= max_t or reduction_factor <= 1:
            raise ValueError(
                f"need 0 < grace_period <= max_t and reduction_factor > 1; got "
                f"{grace_period}, {max_t}, {reduction_factor}"
            )
        super().__init__()
        self._on_prune = on_prune
        self._metrics = tuple(metrics)
        self._modes = tuple(modes)
        self._time_attr = time_attr
        self._max_t = max_t
        self._rf = reduction_factor
        milestones = ray_milestones(grace_period, reduction_factor, max_t)
        self._rungs: list[tuple[float, dict[str, Vector]]] = [(m, {}) for m in reversed(milestones)]
        self._num_stopped = 0

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """Accepts Tune's ``metric``/``mode`` and keeps its own objectives."""
        return True

    def restore_rungs(self, curves: Iterable[Mapping[int, Sequence[float]]]) -> int:
        """Refills the rungs with earlier trials' vectors at each milestone (for a resume).

        Each curve maps an epoch to the objective values in ``metrics`` order. Returns how many
        rung entries were restored; a vector of the wrong length is skipped.
        """
        restored = 0
        for index, curve in enumerate(curves):
            for milestone, recorded in self._rungs:
                vector = curve.get(rung_epoch(milestone))
                if vector is not None and len(vector) == len(self._metrics):
                    recorded[f"earlier-{index}"] = tuple(float(v) for v in vector)
                    restored += 1
        return restored

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        progress = result.get(self._time_attr)
        if progress is None:
            return TrialScheduler.CONTINUE
        if progress >= self._max_t:
            decision = TrialScheduler.STOP
        elif self._record(trial.trial_id, progress, self._vector(result)):
            return TrialScheduler.CONTINUE
        else:
            decision = TrialScheduler.STOP
            self._on_prune(trial.trial_id)
        self._num_stopped += 1
        return decision

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        progress = result.get(self._time_attr)
        if progress is not None:  # as Ray's ASHA does: a rung it had not reached records it
            self._record(trial.trial_id, progress, self._vector(result))

    def debug_string(self) -> str:
        rungs = " | ".join(f"{m:g}: {len(recorded)}" for m, recorded in reversed(self._rungs))
        return f"Using MultiObjectiveASHA: num_stopped={self._num_stopped}; rungs {rungs}"

    def _vector(self, result: Mapping[str, Any]) -> Vector:
        def value(metric: str) -> float:
            try:
                return float(result[metric])
            except (KeyError, TypeError, ValueError):
                return math.nan

        return tuple(value(metric) for metric in self._metrics)

    def _record(self, trial_id: str, progress: float, vector: Vector) -> bool:
        """Records ``vector`` at the highest milestone reached without an entry for the trial;
        returns whether the trial continues."""
        for milestone, recorded in self._rungs:  # highest first
            if progress < milestone or trial_id in recorded:
                continue
            keep = continues(list(recorded.values()), vector, self._modes, self._rf)
            recorded[trial_id] = vector
            return keep
        return True
