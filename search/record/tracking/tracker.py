"""``tracking: {mlflow: URI}``: the search itself in MLflow, written behind the study.

Only the driver writes, from the record it keeps anyway (each trial's outcome, as the bridge
tells the study; see :mod:`search.record.tracking.mlflow_runs`), never the trial processes:
concurrent
trials cannot lose or duplicate a parameter, and a trial Ray retried from its checkpoint is one
run. The writes leave the study's loop: :class:`Tracker` queues them and one thread makes them
in order. A server that does not answer neither stops nor slows the study: the thread retries
behind it, with a growing pause, while the run goes on; when the run ends it waits at most
:data:`CLOSE_WAIT_S` (and not at all once the server has refused a connection again), and
:meth:`Tracker.close` says in one line what was not logged. The URI's password is masked in
that line and in every tag (:func:`search.record.storage.scrub`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from search.errors import one_line
from search.record.folders import study_folder
from search.record.queries import EPOCHS_FILE as EPOCHS
from search.record.queries import read_epochs
from search.record.storage import redact, scrub
from search.record.tracking.mlflow_runs import StudyRuns, TrialRun, study_key

if TYPE_CHECKING:
    import optuna

    from search.specs.schema import StudySpec

Backlog = Callable[[Callable[[int], bool]], Sequence[TrialRun]]
"""Given which trial numbers are logged already, the earlier trials still to log."""

CLOSE_WAIT_S = 15.0
"""The longest the end of a run waits for writes still queued."""
PAUSES_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
"""The pause after the 1st, 2nd, ... failed write in a row (the last one repeats)."""
ATTEMPTS = 3
"""Tries of a write the server refuses (a connection that fails is tried until the end)."""
MAX_QUEUED = 100_000
"""Writes kept waiting at most; beyond, the oldest is given up."""


class Writer(Protocol):
    """What the tracker drives (:class:`search.record.tracking.mlflow_runs.StudyRuns`)."""

    def open(self) -> None: ...

    def logged(self, number: int) -> bool: ...

    def write(self, run: TrialRun) -> None: ...

    def close(self, status: str = "FINISHED") -> None: ...


@dataclass
class _Write:
    kind: str  # "open", "trial" or "close"
    run: TrialRun | None = None
    status: str = "FINISHED"
    attempts: int = 0


_STOP = _Write("stop")


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a failed connection or a timeout,
    rather than an answer that refused the write."""
    import requests

    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, requests.ConnectionError | requests.Timeout | OSError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class Tracker:
    """Writes a study's runs behind it, on a thread of its own.

    Args:
        writer: What makes the writes (MLflow's client calls).
        uri: The tracking URI, for the closing line (shown redacted).
        backlog: The trials finished before this run that are not logged yet (a study
            resumed, or tracked from a later run on, or a server away in an earlier run): they
            are logged first, once the parent run is open.

    Example:
        >>> tracker = Tracker(writer, "sqlite:///mlflow.db")  # doctest: +SKIP
        >>> tracker.trial(TrialRun(0, "COMPLETE", {"lr": 0.1}, {1: {"acc": 0.9}}))  # doctest: +SKIP
        >>> print(tracker.close())  # doctest: +SKIP
        MLflow tracking: 3 writes logged to sqlite:///mlflow.db
    """

    def __init__(self, writer: Writer, uri: str, backlog: Backlog | None = None) -> None:
        self._writer, self._uri, self._backlog = writer, uri, backlog
        self._queue: queue.Queue[_Write] = queue.Queue()
        self._total = 1
        self._logged = 0
        self._lost: list[_Write] = []
        self._reason = ""
        self._down = False
        self._pause_at = 0.0
        self._failures = 0
        self._deadline: float | None = None
        self._pending: deque[_Write] = deque([_Write("open")])
        self._thread = threading.Thread(target=self._loop, name="search-tracking", daemon=True)
        self._thread.start()

    def trial(self, run: TrialRun) -> None:
        """Queues one finished trial; returns at once."""
        self._total += 1
        self._queue.put(_Write("trial", run))

    def close(self, status: str = "FINISHED", wait_s: float = CLOSE_WAIT_S) -> str:
        """Ends the parent run with ``status``, waits at most ``wait_s`` for the writes still
        queued, and returns the one line that says what was logged and what was not."""
        self._total += 1
        self._queue.put(_Write("close", status=status))
        self._queue.put(_Write("stop", status=str(wait_s)))
        self._thread.join(wait_s + 5.0)  # a write under way ends within its HTTP timeout
        return self.line()

    def line(self) -> str:
        """What was logged, or what was not and why, in one line."""
        shown = redact(self._uri)
        lost = self._total - self._logged
        if lost == 0:
            return f"MLflow tracking: {self._total} writes logged to {shown}"
        trials = [w.run.number for w in self._lost + list(self._pending) if w.run is not None]
        which = f", trials {_numbers(trials)} among them" if trials else ""
        reason = one_line(self._reason, limit=200) or f"not done within {CLOSE_WAIT_S:g} s"
        why = f"server {shown} unreachable" if self._down else f"{shown}: {reason}"
        return f"MLflow tracking: {lost} of {self._total} writes not logged{which} ({why})"

    def _loop(self) -> None:
        while self._deadline is None or (self._pending and time.monotonic() < self._deadline):
            self._take()
            if self._pending and time.monotonic() >= self._pause_at:
                self._try()

    def _take(self) -> None:
        """Moves what was queued to the pending writes; waits for some when there is none,
        or until the pause after a failure ends."""
        now = time.monotonic()
        wait = None if not self._pending else max(0.0, self._pause_at - now)
        if self._deadline is not None:
            wait = max(0.0, min(wait if wait is not None else self._deadline, self._deadline - now))
        try:
            item = self._queue.get(timeout=wait)
            while True:
                if item.kind == "stop":
                    self._deadline = time.monotonic() + float(item.status)
                    self._pause_at = 0.0  # one more try at once
                else:
                    self._pending.append(item)
                if len(self._pending) > MAX_QUEUED:
                    self._lost.append(self._pending.popleft())
                item = self._queue.get_nowait()
        except queue.Empty:
            return

    def _try(self) -> None:
        """Makes the pending writes in order until one fails."""
        while self._pending:
            item = self._pending[0]
            try:
                self._make(item)
            except Exception as exc:  # a server's error must never reach the study
                self._failed(item, exc)
                return
            self._pending.popleft()
            self._logged += 1
            self._failures, self._down = 0, False

    def _make(self, item: _Write) -> None:
        if item.kind == "open":
            self._writer.open()
            backlog, self._backlog = self._backlog, None
            runs = list(backlog(self._writer.logged)) if backlog else []
            for run in reversed(runs):  # right after the open, before this run's trials
                self._pending.insert(1, _Write("trial", run))
            self._total += len(runs)
        elif item.kind == "close":
            self._writer.close(item.status)
        elif item.run is not None:
            self._writer.write(item.run)

    def _failed(self, item: _Write, exc: BaseException) -> None:
        self._down = unreachable(exc)
        self._reason = scrub(str(getattr(exc, "message", exc)), self._uri)
        if not self._down:
            item.attempts += 1
            if item.attempts >= ATTEMPTS:
                self._lost.append(self._pending.popleft())
        if self._down and self._deadline is not None:
            self._deadline = 0.0  # the run has ended and the server is still away: give up
        self._pause_at = time.monotonic() + PAUSES_S[min(self._failures, len(PAUSES_S) - 1)]
        self._failures += 1


def _numbers(numbers: list[int]) -> str:
    """``[3, 4, 5, 9]`` as ``3-5, 9``.

    Example:
        >>> _numbers([9, 3, 4, 5])
        '3-5, 9'
    """
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in spans)


def track(spec: StudySpec, study: optuna.Study, results_dir: Path) -> Tracker | None:
    """The tracker of ``spec``'s ``tracking`` block (``None`` without one): the parent run's
    tags and parameters, and the backlog of the study's earlier trials."""
    if spec.tracking is None:
        return None
    uri = spec.tracking.mlflow
    objective = ", ".join(f"{o.metric} {o.mode}" for o in spec.objectives)
    params = {
        "trainable": spec.trainable,
        "objective": objective,
        "max_epochs": spec.budget.max_epochs,
        "data": spec.data.label,
        **{f"fixed.{k}": v for k, v in spec.fixed.items()},
    }
    tags = {
        "search.storage": redact(spec.storage),
        "search.sampler": spec.sampler.name,
        "search.budget_trials": str(spec.budget.trials),
    }
    runs = StudyRuns(uri, spec.study, study_key(study), tags, params)
    before = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    table = study_folder(results_dir, spec.study) / EPOCHS

    def backlog(logged: Callable[[int], bool]) -> list[TrialRun]:
        missing = [t for t in before if not logged(t.number)]
        curves = read_epochs(table) if missing else {}
        return [earlier_run(t, curves.get(t.number, {}), spec.primary.metric) for t in missing]

    return Tracker(runs, uri, backlog)


def earlier_run(
    trial: optuna.trial.FrozenTrial, curves: Mapping[str, Mapping[int, float]], metric: str
) -> TrialRun:
    """A trial of an earlier run as a :class:`TrialRun`: its metrics from ``epochs.csv``
    (``curves``: metric -> epoch -> value), else its intermediate values (``metric``'s)."""
    metrics: dict[int, dict[str, float]] = {}
    for name, curve in curves.items():
        for epoch, value in curve.items():
            metrics.setdefault(epoch, {})[name] = value
    if not metrics:
        metrics = {int(e): {metric: float(v)} for e, v in trial.intermediate_values.items()}
    end = trial.datetime_complete or trial.datetime_start
    attrs: dict[str, Any] = dict(trial.user_attrs)
    return TrialRun(
        trial.number,
        trial.state.name,
        dict(trial.params),
        metrics,
        attrs,
        **({"end_ms": int(end.timestamp() * 1000)} if end else {}),
    )
