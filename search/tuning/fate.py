"""What one trial did, and the rules that turn it into a truthful Optuna state.

Pure code, no Ray and no storage: the bridge feeds Ray's results in, and reads the fate out.

Whose doing it was, the one rule: a trial fails by its own doing when its config or code
made it fail: it raised, its metric or loss turned NaN or infinite, its objective was missing
or not a number, it yielded no epoch. It was cut by the world when something outside its
config stopped it before its last epoch: a full disk (:data:`DISK_FULL`), SIGTERM to the
driver (:data:`TERMINATED`), its node died (:data:`NODE_LOST`), or its driver died (found
and settled by the next run, :func:`search.record.resume.recover`). Its own doing is
``FAIL`` with the reason, counted against ``budget.trials``; the world's is ``FAIL`` with
:data:`search.record.resume.INTERRUPTED`, never counted (:func:`search.record.resume.counts`),
and the next run replaces it. A trial that already
failed by its own doing, or that its scheduler pruned, keeps that fate when the world then
cuts the run (:data:`WORLD`, :meth:`TrialRecord.cut_by_world`).

The rules:
    * a non-finite metric or loss, or a trial that raised -> ``FAIL`` with the reason;
    * stopped by the driver as hung (silent past ``faults.stall_s``) -> ``FAIL`` with
      ``stalled: ...``, whatever else stopped it after;
    * stopped by the scheduler before the epoch budget -> ``PRUNED``;
    * stopped from outside by the user's own limits (``budget.time_limit_s``, a device
      budget, Ctrl-C) or the run's stop after some epochs -> ``PRUNED`` with ``stopped_by``,
      before its first epoch -> ``FAIL`` (with the error it was being retried after, if any);
    * cut by the world before the epoch budget -> ``FAIL`` with
      :data:`search.record.resume.INTERRUPTED`: replaced by the next run;
    * trained to the end, or stopped by its own early-stopping rule -> ``COMPLETE`` with the
      metric of its last epoch (every objective's, in a multi-objective study, each of them
      there and finite, or ``FAIL``);
    * never trained an epoch -> ``FAIL`` ("no epoch reported").
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import TrialState

from search.contract import RESERVED_PREFIX, nonfinite_reason
from search.record.resume import INTERRUPTED

EPOCH = RESERVED_PREFIX + "epoch"
DEVICE = RESERVED_PREFIX + "device"
NODE = RESERVED_PREFIX + "node"
REPLICAS = RESERVED_PREFIX + "replicas"
FAIL_REASON = RESERVED_PREFIX + "fail_reason"
TRACEBACK = RESERVED_PREFIX + "traceback"
"""Where the full traceback of a trial's error was written."""
LOG = RESERVED_PREFIX + "log"
"""Where the trial's stdout and stderr go (``output.log`` in its folder)."""
CODE_ERROR = RESERVED_PREFIX + "code_error"
"""Set on a failing result whose cause is the trainable's code: the same every time."""
METRIC_KEYS = RESERVED_PREFIX + "metrics"
"""The names of the metrics the trainable itself yielded (Tune adds its own beside them)."""
DROPPED = RESERVED_PREFIX + "dropped"
"""The names of the metrics the trainable yielded that were not numbers (left out)."""
LIMITS = RESERVED_PREFIX + "limits"
"""What the framework applied in the trial's process (threads, GPU memory cap), as JSON: Tune
flattens a dict in a result into one key per entry."""
NO_VALUE = RESERVED_PREFIX + "no_value"
"""Set on a failing result whose objective was missing or not a number (a NaN stands in)."""
UNREAD = RESERVED_PREFIX + "unread"
"""The config keys a plain-function trainable has not read so far (``[]`` after a bulk read;
absent for a declared trainable, whose knobs are checked before the run): see
:mod:`search.contract.reads`."""
MISSED = RESERVED_PREFIX + "missed"
"""The keys that trainable asked its config for and the config did not hold."""
SEED = RESERVED_PREFIX + "seed"
NUMBER = RESERVED_PREFIX + "trial_number"
INTERRUPT = "interrupt"
"""The ``interrupted`` cause of trials cut by Ctrl-C: the user's doing
(search/tuning/signals.py)."""
TERMINATED = "SIGTERM"
"""The ``interrupted`` cause of trials cut by SIGTERM to the driver (search/tuning/signals.py)."""
DISK_FULL = "disk full"
"""The ``interrupted`` cause of trials cut because a disk the run writes to is full (a
trial's own checkpoint or output, or Tune's experiment state; search/tuning/faults.py)."""
NODE_LOST = "node lost"
"""The ``interrupted`` cause of a trial whose Ray node died under it (search/tuning/death.py)."""
WORLD = frozenset({TERMINATED, DISK_FULL, NODE_LOST})
"""The ``interrupted`` causes that are the world's doing, not the config's (module
docstring): a trial they cut is replaced. The user's own limits (a time limit, a device
budget, Ctrl-C) are not among them: stopping is then the user's choice, and counts."""


@dataclass
class TrialRecord:
    """Everything the bridge has learned about one running trial."""

    metric: str
    max_epochs: int
    objectives: tuple[str, ...] = ()
    """The other objectives of a multi-objective study, after ``metric``."""
    curve: dict[int, float] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)
    pruned: bool = False
    error: str | None = None
    errored: bool = False
    retries: int = 0
    retried_after: list[str] = field(default_factory=list)
    """The error of each attempt that was retried, one line each (user attribute
    ``retried_after``)."""
    interrupted: str | None = None
    """What cut the trial short from outside: ``"time limit"``, ``"interrupt"``, ``"budget"``
    or one of :data:`WORLD`."""
    traceback: str | None = None
    """Where the full traceback of its error is (a file on the node that ran it)."""
    log: str | None = None
    """Where its stdout and stderr are (a file on the node that ran it)."""
    code_error: bool = False
    """Whether it failed by its code (an error that no retry fixes, a missing metric)."""
    stalled: str | None = None
    """Why the driver stopped it as hung (``stalled: no epoch for 62 s ...``)."""
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    """Every numeric metric the trainable yielded, per epoch."""
    dropped: set[str] = field(default_factory=set)
    """The metrics it yielded that were not numbers, over all its epochs."""
    unread: tuple[str, ...] | None = None
    """The config keys it had not read at its last report (``None``: not watched)."""
    missed: tuple[str, ...] = ()
    """The keys it asked for that its config did not hold."""

    def add(self, result: Mapping[str, Any]) -> tuple[int, float] | None:
        """Takes one reported result; returns ``(epoch, value)`` if it is a new epoch."""
        self.traceback = result.get(TRACEBACK) or self.traceback
        self.log = result.get(LOG) or self.log
        self.code_error = bool(result.get(CODE_ERROR)) or self.code_error
        self.dropped.update(str(name) for name in result.get(DROPPED) or ())
        if UNREAD in result:
            self.unread = tuple(result[UNREAD] or ())
            self.missed = tuple(result.get(MISSED) or ())
        if result.get(NO_VALUE):
            self.last = dict(result)
            return None
        if self.metric not in result:
            return None
        epoch = int(result.get(EPOCH, result.get("training_iteration", len(self.curve) + 1)))
        self.last = dict(result)
        if epoch in self.curve:
            return None
        yielded = result.get(METRIC_KEYS, ())
        self.metrics[epoch] = {
            k: float(result[k]) for k in yielded if isinstance(result.get(k), int | float)
        }
        value = float(result[self.metric])
        self.curve[epoch] = value
        return epoch, value

    def values(self) -> list[float]:
        """The last epoch's value of every objective, ``metric`` first (NaN where missing).

        Example:
            >>> record = TrialRecord("acc", 3, objectives=("latency_ms",))
            >>> record.add({"acc": 0.9, "latency_ms": 2.5, METRIC_KEYS: ["acc", "latency_ms"]})
            (1, 0.9)
            >>> record.values()
            [0.9, 2.5]
        """
        last = self.metrics.get(self.epochs, {})
        return [self.curve.get(self.epochs, math.nan)] + [
            last.get(name, math.nan) for name in self.objectives
        ]

    @property
    def epochs(self) -> int:
        """How many epochs the trial trained."""
        return max(self.curve, default=0)

    def fate(self) -> tuple[TrialState, float | None, str | None]:
        """The trial's final ``(state, value, fail reason)``."""
        own = self.stalled or self.last.get(FAIL_REASON)  # hung, a NaN, a bad metric, its code
        if own is None and self.cut_by_world():  # the world's error (a full disk) is not its
            return TrialState.FAIL, None, INTERRUPTED
        reason = own or self.error
        if reason is None and self.errored:
            reason = "the trial raised an error"
        if reason is None and not self.curve:
            reason = "no epoch reported"
            if self.interrupted:  # a retry the run's stop cut still says what it retried
                before = f"{self.retried_after[-1]}; its retry " if self.retried_after else ""
                reason = f"{before}ended before its first epoch ({self.interrupted})"
        if reason is not None:
            return TrialState.FAIL, None, str(reason)
        value = self.curve[self.epochs]
        if not math.isfinite(value):
            return TrialState.FAIL, None, nonfinite_reason({self.metric: value}, self.epochs)
        last = self.metrics.get(self.epochs, {})
        for name in self.objectives:
            if name not in last:
                reason = f"metric {name} missing at epoch {self.epochs}"
                return TrialState.FAIL, None, reason
            if not math.isfinite(last[name]):
                return TrialState.FAIL, None, nonfinite_reason({name: last[name]}, self.epochs)
        if (self.pruned or self.interrupted) and self.epochs < self.max_epochs:
            return TrialState.PRUNED, value, None
        return TrialState.COMPLETE, value, None

    def cut_by_world(self) -> bool:
        """Whether the world (:data:`WORLD`) cut the trial, before its epoch budget and its
        scheduler's verdict: then it is interrupted and replaced (module docstring).

        Example:
            >>> record = TrialRecord("acc", 3, interrupted=DISK_FULL)
            >>> record.add({"acc": 0.5, "training_iteration": 1})
            (1, 0.5)
            >>> record.cut_by_world(), record.fate()[0].name
            (True, 'FAIL')
        """
        return self.interrupted in WORLD and not self.pruned and self.epochs < self.max_epochs

    def user_attrs(self) -> dict[str, Any]:
        """What the study records about the trial beside its values."""
        attrs: dict[str, Any] = {
            "epochs": self.epochs,
            "seconds": round(float(self.last.get("time_total_s", 0.0)), 3),
            "retries": self.retries,
        }
        if self.retried_after:
            attrs["retried_after"] = list(self.retried_after)
        if self.interrupted and not self.pruned and self.epochs < self.max_epochs:
            attrs["stopped_by"] = self.interrupted
        for key in (DEVICE, NODE, REPLICAS):
            if key in self.last:
                attrs[key.removeprefix(RESERVED_PREFIX)] = self.last[key]
        if isinstance(self.last.get(LIMITS), str):
            attrs["limits"] = json.loads(self.last[LIMITS])
        if self.metrics:
            last = self.metrics[max(self.metrics)]
            attrs["metrics"] = {k: v for k, v in last.items() if math.isfinite(v)}
        if self.dropped:
            attrs["dropped_metrics"] = sorted(self.dropped)
        if self.traceback:
            attrs["traceback"] = self.traceback
        if self.log:
            attrs["log"] = self.log
        return attrs
