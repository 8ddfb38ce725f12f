"""TPE's cost bounded in big studies: which trials it models at each ask.

Optuna's TPE reads every trial at each ask and builds its densities from all of them, so an
ask costs O(n log n) in the study's n trials (Optuna's docs suggest TPE for 100 to 1,000
trials); through the bridge, an ask at 10,000 trials took half a second and more.
:class:`BoundedTPESampler` shows TPE at most :data:`HISTORY_LIMIT` trials: every running one
(the constant liar keeps parallel asks apart with them), the :data:`BEST_KEPT` best finished
ones (TPE's "good" group, 25 trials at most with its default ``gamma``, is drawn from those),
then the most recent others. A study at or under the limit is modelled whole: TPE then
samples exactly as Optuna's own. With ``group=True`` it also reads each finished trial once
for the grouped search space, which Optuna rebuilds from every trial at every ask.
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Sequence
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

HISTORY_LIMIT = 1000
"""Most trials TPE models at one ask."""

BEST_KEPT = 100
"""The best finished trials always modelled, however old."""


def bounded(
    trials: Sequence[FrozenTrial],
    directions: Sequence[StudyDirection],
    limit: int = HISTORY_LIMIT,
) -> list[FrozenTrial]:
    """``trials`` (in study order) cut down to ``limit``: the running ones, the best finished
    ones (single objective), the most recent others.

    Example:
        >>> from optuna.trial import create_trial
        >>> trials = [create_trial(value=float(v)) for v in (9, 1, 2, 3, 4)]
        >>> for number, trial in enumerate(trials):
        ...     trial.number = number
        >>> [t.value for t in bounded(trials, [StudyDirection.MAXIMIZE], limit=3)]
        [9.0, 3.0, 4.0]
    """
    if len(trials) <= limit:
        return list(trials)
    sign = -1.0 if directions[0] == StudyDirection.MAXIMIZE else 1.0
    keep, done = set(), []
    for i, trial in enumerate(trials):  # one pass: this runs at every ask
        if trial.state == TrialState.RUNNING:
            keep.add(i)
        elif trial.state == TrialState.COMPLETE and trial.values and len(directions) == 1:
            done.append((sign * trial.values[0], i))
    keep.update(i for _, i in heapq.nsmallest(min(BEST_KEPT, limit // 2), done))
    i = len(trials) - 1
    while len(keep) < limit and i >= 0:  # then the most recent
        keep.add(i)
        i -= 1
    return [trials[i] for i in sorted(keep)]


class _Reads:
    """The study as one of TPE's reads sees it: each read of its trials passes through
    :meth:`_pick`; everything else is the study's."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(
        self,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
        use_cache: bool = False,
    ) -> list[FrozenTrial]:
        trials = self._study._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache)
        return self._pick(trials, states, deepcopy or not use_cache)

    def get_trials(
        self, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        return self._get_trials(deepcopy=deepcopy, states=states)

    def _pick(
        self, trials: list[FrozenTrial], states: Container[TrialState] | None, fresh: bool
    ) -> list[FrozenTrial]:
        raise NotImplementedError


class _Bounded(_Reads):
    """Every read of the trials cut down by :func:`bounded`."""

    def __init__(self, study: optuna.Study, limit: int, memo: dict[Any, Any]) -> None:
        super().__init__(study)
        self._limit, self._memo = limit, memo

    def _pick(
        self, trials: list[FrozenTrial], states: Container[TrialState] | None, fresh: bool
    ) -> list[FrozenTrial]:
        snapshot = getattr(self._study._thread_local, "cached_all_trials", None)
        if snapshot is None or (fresh and len(trials) <= self._limit):
            return bounded(trials, self._study.directions, self._limit)
        # One ask reads the study's per-ask snapshot of its trials several times (Optuna's
        # ``use_cache``): bound the snapshot once, then pick the states asked for.
        if self._memo.get("snapshot") is not snapshot:
            kept = bounded(snapshot, self._study.directions, self._limit)
            self._memo["snapshot"] = snapshot  # held, so its id is not reused meanwhile
            self._memo["bounded"] = kept
            self._memo["numbers"] = {t.number for t in kept}
        if fresh:  # the constant liar's own reads, once per parameter group: the same trials,
            # and any trial running since the snapshot (one bounding pass per ask, not three)
            numbers = self._memo["numbers"]
            return [t for t in trials if t.number in numbers or t.state == TrialState.RUNNING]
        kept = self._memo["bounded"]
        return [t for t in kept if states is None or t.state in states]


class _Unseen(_Reads):
    """Only the finished trials not read before: for TPE's grouped search space, which only
    grows (a union of each finished trial's distributions), so reading each trial once gives
    the space Optuna's re-reading of every trial at every ask gives."""

    def __init__(self, study: optuna.Study, seen: set[int]) -> None:
        super().__init__(study)
        self._seen = seen

    def _pick(
        self, trials: list[FrozenTrial], states: Container[TrialState] | None, fresh: bool
    ) -> list[FrozenTrial]:
        new = [t for t in trials if t.number not in self._seen and t.state.is_finished()]
        self._seen.update(t.number for t in new)
        return new


class BoundedTPESampler(optuna.samplers.TPESampler):
    """Optuna's :class:`~optuna.samplers.TPESampler` that models at most ``history_limit``
    trials per ask (see the module's text); every other argument is TPE's.

    Example:
        >>> sampler = BoundedTPESampler(seed=0, history_limit=500)
        >>> study = optuna.create_study(sampler=sampler)
        >>> study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
        >>> len(study.trials)
        3
    """

    def __init__(self, *args: Any, history_limit: int = HISTORY_LIMIT, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._history_limit = history_limit
        self._grouped: set[int] = set()  # trials the grouped search space has read
        self._memo: dict[Any, Any] = {}  # the bounded trials of the current ask's snapshot

    def _view(self, study: optuna.Study) -> Any:
        return _Bounded(study, self._history_limit, self._memo)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, Any]:
        if self._group_decomposed_search_space is not None:  # group=True
            unseen: Any = _Unseen(study, self._grouped)  # a Study to TPE
            return super().infer_relative_search_space(unseen, trial)
        return super().infer_relative_search_space(self._view(study), trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, Any]
    ) -> dict[str, Any]:
        return super().sample_relative(self._view(study), trial, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: Any,
    ) -> Any:
        return super().sample_independent(self._view(study), trial, param_name, param_distribution)
