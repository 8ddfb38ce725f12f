"""The stall rule: the driver stops a trial that went silent, as hung, and frees its slot.

A trial that hangs inside an epoch (a deadlock, a stuck data loader, a collective waiting for
a peer that died) raises nothing and reports nothing. Tune waits for it for ever: without
``budget.time_limit_s`` the run never ends; with one, the trial holds its slot to the limit and
is recorded as an ordinary time-limit PRUNED trial. The worker cannot watch itself (it is the
one that hangs), so the driver does: :class:`StallWatch` is a Tune callback whose
``on_step_begin`` runs every pass of Tune's loop, whether or not any trial reports (a
``Stopper`` is only called on results).

The silence of a trial is counted from its last result, or from its (re)start before its first
epoch. A trial silent longer than :func:`stall_limit` is recorded FAIL with a reason that says
how long (``stalled: no epoch for 62 s (median epoch 0.4 s)``), not retried and not counted as
its code's error; its actor is killed, so the next trial starts in its place.

When the whole run stops (its time limit, a signal, a takeover, a fail-fast verdict), Tune asks
each running trial to stop, which its process does only once its epoch in progress ends, and
kills it only 10 s after that, at the end of the run: a hung trial held the run that long past
its time limit. :class:`StopStragglers` kills the processes of the trials still alive
:data:`GRACE_S` after the run stopped.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ray.tune import Callback

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

MULTIPLE = 10.0
"""Under ``faults.stall_s: auto``, how many median epochs of silence make a trial hung."""
FLOOR_S = 60.0
"""Under ``auto``, the least silence that makes a trial hung, however short its epochs."""
GRACE_S = 2.0
"""How long the trials still running when the run stops have to end before they are killed."""


@dataclass
class EpochTimes:
    """The epoch times a run has seen, kept sorted: first epochs (from a trial's start, with
    its imports and data loading) apart from the others."""

    first: list[float] = field(default_factory=list)
    later: list[float] = field(default_factory=list)

    def add(self, seconds: float, first: bool) -> None:
        """Records one epoch's time."""
        bisect.insort(self.first if first else self.later, seconds)

    def median(self, first: bool) -> float | None:
        """The median time of first (or later) epochs; ``None`` before one was timed. Before
        a later epoch was timed, later epochs take the first epochs' (longer, as a rule)."""
        times = self.first if first or not self.later else self.later
        if not times:
            return None
        middle = len(times) // 2
        return times[middle] if len(times) % 2 else (times[middle - 1] + times[middle]) / 2


def stall_limit(stall_s: float | None, median: float | None) -> float | None:
    """Seconds of silence after which a trial is hung; ``None``: no limit yet.

    Args:
        stall_s: ``faults.stall_s``; ``None`` is ``auto``.
        median: The median time of the epochs like the one the trial is in (first or later).

    Example:
        >>> stall_limit(None, 0.4), stall_limit(None, 30.0), stall_limit(None, None)
        (60.0, 300.0, None)
        >>> stall_limit(3.0, None)
        3.0
    """
    if stall_s is not None:
        return stall_s
    if median is None:  # nothing timed yet: a long first epoch is not a hang
        return None
    return max(FLOOR_S, MULTIPLE * median)


def stall_reason(silent_s: float, first: bool, stall_s: float | None, median: float | None) -> str:
    """The ``fail_reason`` of a hung trial: how long it was silent, against what.

    Example:
        >>> stall_reason(62.3, False, None, 0.41)
        'stalled: no epoch for 62 s (median epoch 0.41 s)'
        >>> stall_reason(3.2, True, 3.0, None)
        'stalled: no first epoch for 3.2 s (faults.stall_s 3 s)'
        >>> stall_reason(125.0, True, None, 12.5)
        'stalled: no first epoch for 125 s (median first epoch 12 s)'
    """
    what = "no first epoch" if first else "no epoch"
    against = (
        f"faults.stall_s {stall_s:g} s"
        if stall_s is not None
        else f"median {'first ' if first else ''}epoch {_seconds(median or 0.0)} s"
    )
    return f"stalled: {what} for {_seconds(silent_s)} s ({against})"


def _seconds(value: float) -> str:
    """Seconds for people: whole ones from 10 up, two significant digits below."""
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


class StallWatch(Callback):
    """Stops the trials that went silent longer than :func:`stall_limit` (a Tune callback).

    Args:
        stall_s: ``faults.stall_s`` (``None``: auto).
        on_stall: Receives the Ray trial id and the reason before the trial's actor is killed.
        clock: Seconds from any fixed point (tests pass their own).
    """

    def __init__(
        self,
        stall_s: float | None,
        on_stall: Callable[[str, str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stall_s = stall_s
        self._on_stall = on_stall
        self._clock = clock
        # trial id -> (the trial, its last event, whether its first epoch is still to come)
        self._since: dict[str, tuple[Trial, float, bool]] = {}
        self.times = EpochTimes()

    def on_trial_start(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self._since[trial.trial_id] = (trial, self._clock(), True)

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info: Any
    ) -> None:
        if trial.trial_id in self._since:
            _, since, first = self._since[trial.trial_id]
            now = self._clock()
            self.times.add(now - since, first)
            self._since[trial.trial_id] = (trial, now, False)

    def on_trial_complete(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self._since.pop(trial.trial_id, None)

    on_trial_error = on_trial_complete
    on_trial_recover = on_trial_complete  # a retry starts again (on_trial_start)

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        now = self._clock()
        for trial, since, first in list(self._since.values()):  # the live ones, not all
            if trial.status != trial.RUNNING:  # stopped from outside (the time limit)
                continue
            median = self.times.median(first)
            limit = stall_limit(self._stall_s, median)
            if limit is not None and now - since > limit:
                del self._since[trial.trial_id]
                self._on_stall(
                    trial.trial_id, stall_reason(now - since, first, self._stall_s, median)
                )
                _kill(trial)


def _kill(trial: Trial) -> None:
    """Kills the trial's actor, so Tune frees its slot, and forbids Tune to retry it: a hung
    trial would hang again, and its fate is already decided."""
    import ray

    trial.max_failures = trial.run_metadata.num_failures  # the kill's failure is one more
    actor = trial.temporary_state.ray_actor
    if actor is not None:
        ray.kill(actor, no_restart=True)


class StopStragglers(Callback):
    """Kills the processes of the trials that still run :data:`GRACE_S` after the run
    stopped (a Tune callback; module docstring).

    Args:
        stopped: Says whether the run has stopped (its stoppers said so).
        grace_s: How long the trials have to end by themselves.
    """

    def __init__(self, stopped: Callable[[], bool], grace_s: float = GRACE_S) -> None:
        self._stopped = stopped
        self._grace_s = grace_s
        self._actors: dict[str, Any] = {}  # trial id -> the actor of a running trial
        self._armed = False
        self._timer: threading.Timer | None = None

    def __getstate__(self) -> dict[str, Any]:  # Ray pickles callbacks: handles stay
        return {**self.__dict__, "_actors": {}, "_timer": None}

    def on_trial_start(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        if trial.temporary_state.ray_actor is not None:
            self._actors[trial.trial_id] = trial.temporary_state.ray_actor

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        # Tune forgets a trial's actor as it asks it to stop: the running ones, kept now
        self._actors = {
            t.trial_id: t.temporary_state.ray_actor
            for t in trials
            if t.status == t.RUNNING and t.temporary_state.ray_actor is not None
        }

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if self._armed or not self._stopped():
            return
        self._armed = True
        actors = list(self._actors.values())
        self._timer = threading.Timer(self._grace_s, _kill_actors, args=(actors,))
        self._timer.daemon = True  # the run may end before it fires
        self._timer.start()

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        if self._timer is not None:  # every trial ended: nothing left to kill
            self._timer.cancel()


def _kill_actors(actors: list[Any]) -> None:
    """Kills each actor (one that already ended costs nothing); Tune then counts it stopped."""
    import ray

    if not ray.is_initialized():  # the run ended first: a Ray call now would start a new Ray
        return
    for actor in actors:
        with contextlib.suppress(Exception):  # Ray shut down, or the actor is gone
            ray.kill(actor, no_restart=True)
