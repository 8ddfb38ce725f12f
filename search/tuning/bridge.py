"""The bridge between Ray Tune and an Optuna study, keeping the study truthful.

Ray's stock ``OptunaSearch`` is wrong for us in three ways (measured with Ray 2.60 and Optuna
5.0): trials that ASHA stopped are told COMPLETE; the last epoch of every trial is missing from
its intermediate values, because Ray only calls ``Searcher.on_trial_result`` for results that do
not stop the trial; and trials whose metric turns NaN stay RUNNING. So we keep a
:class:`~search.tuning.fate.TrialRecord` per trial, take the stopping result from
``on_trial_complete`` too, learn of ASHA's stops from the scheduler (see
:mod:`search.tuning.scheduler`) and of errors from a Tune callback, and tell Optuna once, at the
end.

The study itself is the searcher's persistent state, so nothing else is pickled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState
from ray.tune import Callback
from ray.tune.search import Searcher

from search.errors import error_summary
from search.record.resume import FATE, fate_record, settle_open
from search.record.warm import START_FROM
from search.record.writeback import WriteBehindStorage
from search.specs.space import sample
from search.tuning.death import Deaths, node_lost
from search.tuning.fate import NODE_LOST, NUMBER, SEED, TrialRecord
from search.tuning.faults import DiskFault
from search.tuning.oom import out_of_memory
from search.tuning.output import LOG_FILE

TAKEN = "taken over"
"""What cut a run whose study another driver took over (:mod:`search.record.lease`)."""

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ray.tune.experiment import Trial

    from search.specs.space import Param


@dataclass(frozen=True)
class Outcome:
    """What became of one trial, once the study holds it.

    Args:
        number: The Optuna trial number.
        state: ``COMPLETE``, ``PRUNED`` or ``FAIL``.
        reason: Why it failed (``None`` unless FAIL).
        traceback: The file that holds its error's traceback, when it raised.
        log: The file that holds its stdout and stderr.
        code_error: Whether its own code failed it (an error no retry fixes, a missing metric,
            an error that outlived its retries), as opposed to a NaN, a hang or an interrupt.
        metrics: Every numeric metric it yielded, per epoch.
        dropped: The sorted names of the metrics it yielded that were not numbers.
        unread: The config keys its trainable never read (``None``: not watched; see
            :mod:`search.contract.reads`).
        missed: The keys its trainable asked for that its config did not hold.
        params: Its sampled parameters, as the study holds them.
        attrs: The user attributes the study holds for it (``epochs``, ``stopped_by``, ...).
    """

    number: int
    state: str
    reason: str | None = None
    traceback: str | None = None
    code_error: bool = False
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()
    log: str | None = None
    unread: tuple[str, ...] | None = None
    missed: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)


class OptunaBridge(Searcher):
    """A Ray Tune searcher that asks an Optuna study for configs and tells it the truth.

    Args:
        study: The Optuna study (any storage) that proposes and records.
        space: The define-by-run space, sampled on each new Optuna trial.
        fixed: Values merged into every config unchanged.
        metric: The objective metric the trainable reports (the first, with several).
        mode: ``"min"`` or ``"max"``.
        objectives: The other objectives of a multi-objective study. Its trials get no
            intermediate values (Optuna refuses ``report`` there); their curves are in
            ``epochs.csv`` and the user attribute ``metrics``.
        max_epochs: The epoch budget: a trial stopped before it was pruned.
        seed: Base seed; trial ``n`` trains with ``seed + n``.
        run_id: This run's id, recorded on every trial it creates (user attribute ``driver``).
        listeners: Called with each trial's :class:`Outcome` once the study holds it.
        start: ``(index, config)`` of the ``sampler.start_from`` configs still to run: the
            next trials take them, in order (:mod:`search.record.warm`).
        fence: Whether this run still holds the study's lease, read afresh (``True``) or as
            last known (``False``): :meth:`search.record.lease.StudyLease.holds`. Checked
            before and after every ``ask``, before every ``tell`` and, as last known, on every
            result: once another driver took the study, this bridge asks for no trial and
            writes none of its trials (:data:`TAKEN`).

    Example:
        >>> bridge = OptunaBridge(study, spec.space, {}, metric="val_accuracy",
        ...                       mode="max", max_epochs=27)  # doctest: +SKIP
    """

    def __init__(
        self,
        study: optuna.Study,
        space: Mapping[str, Param],
        fixed: Mapping[str, Any],
        *,
        metric: str,
        mode: str,
        max_epochs: int,
        objectives: Sequence[str] = (),
        seed: int = 0,
        run_id: str = "",
        listeners: Sequence[Callable[[Outcome], None]] = (),
        start: Sequence[tuple[int, Mapping[str, Any]]] = (),
        fence: Callable[[bool], bool] | None = None,
    ) -> None:
        super().__init__(metric=metric, mode=mode)
        self._study = study
        self._space = dict(space)
        self._fixed = dict(fixed)
        self._max_epochs = max_epochs
        self._objectives = tuple(objectives)
        self._seed = seed
        self._driver = run_id
        self._live: dict[str, tuple[optuna.Trial, TrialRecord]] = {}
        self._listeners = list(listeners)
        self._start = list(start)
        self._fence = fence
        self.finished: dict[str, tuple[int, str]] = {}
        """Ray trial id -> (Optuna trial number, final state name), for callers and tests."""
        self.outcomes: dict[str, Outcome] = {}
        """Ray trial id -> what became of the trial."""
        self.cut_by: str | None = None
        """What cut the whole run (:meth:`cut`), once it did: no trial starts after."""

    @property
    def study(self) -> optuna.Study:
        """The study this bridge asks and tells."""
        return self._study

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if self.cut_by is not None or not self.holds():
            return Searcher.FINISHED  # type: ignore[return-value]
        trial = self._ask()
        if not self.holds():  # taken between the check and the ask: the trial never runs
            self._let_go(trial)
            return Searcher.FINISHED  # type: ignore[return-value]
        params = sample(trial, self._space)
        trial.set_user_attr("ray_trial_id", trial_id)
        record = TrialRecord(self.metric or "", self._max_epochs, self._objectives)
        self._live[trial_id] = (trial, record)
        return {**self._fixed, **params, SEED: self._seed + trial.number, NUMBER: trial.number}

    def _ask(self) -> optuna.Trial:
        """``study.ask()`` in one commit: the trial is born RUNNING with this run's id, so no
        trial is ever RUNNING without the id of the run that owns it. (Born WAITING, then
        taken by ``ask``, it cost a second commit that waits for every queued write.) Nothing
        here enqueues trials, and a resume fails the WAITING ones a dead driver left."""
        study = self._study
        study._thread_local.cached_all_trials = None  # as ask: read the storage afresh
        template = running_template(self._driver, self._start.pop(0) if self._start else None)
        return optuna.Trial(study, study._storage.create_new_trial(study._study_id, template))

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if trial_id in self._live:  # not when a cut of the run settled it a moment ago
            self._add(trial_id, result)

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        if trial_id not in self._live:
            return
        if result:
            self._add(trial_id, result)
            # Ray marks a result done when the trial ended itself or its scheduler stopped
            # it; a trial stopped by the time budget (or Ctrl-C) ends on a result that is not.
            record = self._live[trial_id][1]
            if not error and not result.get("done", False) and not record.interrupted:
                record.interrupted = "interrupt"
        if error:
            # The error's text arrives just after, through ErrorCallback.on_trial_error.
            self._live[trial_id][1].errored = True
            return
        self._finish(trial_id)

    def mark_pruned(self, trial_id: str) -> None:
        """Called by the scheduler when it stops a trial before its epoch budget."""
        if trial_id in self._live:
            self._live[trial_id][1].pruned = True

    def mark_interrupted(self, trial_id: str, cause: str = "time limit") -> None:
        """Called by the deadline stopper when it cuts a trial short."""
        if trial_id in self._live:
            self._live[trial_id][1].interrupted = cause

    def mark_stalled(self, trial_id: str, reason: str) -> None:
        """Called by :class:`search.tuning.stall.StallWatch` before it kills a hung trial; the
        kill's error then ends the trial FAIL with ``reason``."""
        if trial_id in self._live:
            self._live[trial_id][1].stalled = reason

    def record_error(self, trial_id: str, message: str, traceback: str | None = None) -> None:
        """Called by :class:`ErrorCallback` with the one-line summary of a trial's error and
        the file that holds its traceback (none for a hung trial: the error is its kill)."""
        if trial_id in self._live:
            record = self._live[trial_id][1]
            record.error, record.errored = message, True
            if not record.stalled:
                record.traceback = traceback or record.traceback
            self._finish(trial_id)

    def record_start(self, trial_id: str, log: str) -> None:
        """Called by :class:`ErrorCallback` when a trial starts: its output's file, recorded
        now (``user_attrs.log``) so ``search logs --follow`` finds a running trial's."""
        if trial_id in self._live:
            trial, record = self._live[trial_id]
            if record.log != log:
                record.log = log
                trial.set_user_attr("log", log)

    def record_retry(self, trial_id: str, reason: str | None = None) -> None:
        """Called by :class:`ErrorCallback` when Ray retries a trial from its checkpoint, with
        the one-line error of the attempt that failed."""
        if trial_id in self._live:
            record = self._live[trial_id][1]
            record.retries += 1
            record.retried_after.append(reason or "the trial raised an error")

    def finalize(self, cause: str = "interrupt", cut: bool = False) -> None:
        """Tells every trial still open its fate: errored, or cut off by ``cause`` (the time
        limit, or an interrupt) when the study ended. ``cut``: ``cause`` overrides what
        stopped them before (SIGTERM ends the trials a time limit was stopping too)."""
        for trial_id in list(self._live):
            record = self._live[trial_id][1]
            if not record.errored and (cut or not record.interrupted):
                record.interrupted = cause
            self._finish(trial_id)

    def cut(self, cause: str, trial_id: str | None = None) -> None:
        """The world or Ctrl-C cut the run (``cause``, one of :data:`search.tuning.fate.WORLD`,
        or :data:`search.tuning.fate.INTERRUPT`): every
        trial still open is settled at once as cut by it, ``trial_id``'s too when its own
        error was the world's (a full disk), and no new trial starts."""
        self.cut_by = cause
        if trial_id is not None:
            self.mark_interrupted(trial_id, cause)
        self.finalize(cause, cut=True)

    def holds(self, read: bool = True) -> bool:
        """Whether this run still holds the study (always, without a ``fence``); once it does
        not, the run is cut (:data:`TAKEN`)."""
        if self._fence is None:
            return True
        if self.cut_by != TAKEN and self._fence(read):
            return True
        self.cut_by = TAKEN
        return False

    def _let_go(self, trial: optuna.Trial) -> None:
        """A trial of a study another driver took: failed as interrupted if still open (that
        driver settled every trial open when it took the study; not one this run asked for
        after), never told its fate here."""
        storage = self._study._storage
        if isinstance(storage, WriteBehindStorage):
            with contextlib.suppress(Exception):  # writes to trials already settled fail
                storage.flush()
            storage = storage.inner
        settle_open(storage, trial._trial_id)

    def _add(self, trial_id: str, result: Mapping[str, Any]) -> None:
        if not self.holds(read=False):
            return
        trial, record = self._live[trial_id]
        new = record.add(result)
        if new is not None and not self._objectives:
            epoch, value = new
            trial.report(value, step=epoch)

    def _finish(self, trial_id: str) -> None:
        trial, record = self._live.pop(trial_id)
        if not self.holds():
            self._let_go(trial)
            return
        try:
            self._tell(trial_id, trial, record)
        except Exception:
            if self.holds():
                raise
            self._let_go(trial)  # taken while it was told

    def _tell(self, trial_id: str, trial: optuna.Trial, record: TrialRecord) -> None:
        """Writes the trial's fate, then tells the study, then the listeners."""
        state, value, reason = record.fate()
        attrs = {**record.user_attrs(), **({"fail_reason": reason} if reason else {})}
        stored = _told_values(record, state, value)
        values = stored if state == TrialState.COMPLETE else None
        # The fate in one write first: a driver killed before ``tell`` lands loses nothing,
        # the next run applies it (search/record/resume.py).
        self._study._storage.set_trial_system_attr(
            trial._trial_id, FATE, fate_record(state, stored, attrs)
        )
        for key, attr in attrs.items():
            trial.set_user_attr(key, attr)
        self._study.tell(trial, values, state=state)
        self.finished[trial_id] = (trial.number, state.name)
        outcome = Outcome(
            trial.number,
            state.name,
            reason,
            record.traceback,
            (record.code_error or record.errored) and not record.stalled,
            dict(record.metrics),
            tuple(sorted(record.dropped)),
            record.log,
            record.unread,
            record.missed,
            dict(trial.params),
            attrs,
        )
        self.outcomes[trial_id] = outcome
        for listener in self._listeners:
            listener(outcome)

    # The Optuna storage is the durable state. Ray pickles the searcher into its experiment
    # folder (tuner.pkl, searcher checkpoints); the study, and with it a storage URL that may
    # hold a password, must not go there, nor the listeners (the tracker holds its URI).
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_study": None, "_live": {}, "_listeners": [], "_fence": None}

    def save(self, checkpoint_path: str) -> None:
        pass

    def restore(self, checkpoint_path: str) -> None:
        pass


def _told_values(record: TrialRecord, state: TrialState, value: float | None) -> list[float] | None:
    """The values the study keeps: every objective's for a COMPLETE trial, the objective's
    last value for a PRUNED single-objective one (Optuna's own rule), else none."""
    if state == TrialState.COMPLETE:
        return record.values()
    if state == TrialState.PRUNED and not record.objectives and value is not None:
        return [value]
    return None


class ErrorCallback(Callback):
    """Hands a failed trial's error, as one line, to the bridge, counts retries, and tells
    it where each trial's output goes (``output.log`` in the trial's folder). A trial whose
    process died fails with what ended it, read from that log (:mod:`search.tuning.death`). An
    error that is a full disk goes to ``fault`` instead, at the first attempt (no retry would
    help): the world's doing, not the trial's (:mod:`search.tuning.faults`). The error of an
    attempt that raised and is retried (not a death, not a GPU out of memory) goes to
    ``attempts`` too, as the trial's first showing (:class:`search.tuning.stopping.FailFast`)."""

    def __init__(
        self,
        bridge: OptunaBridge,
        fault: DiskFault | None = None,
        attempts: Callable[[Outcome], None] = lambda outcome: None,
    ) -> None:
        self._bridge = bridge
        self._deaths = Deaths()
        self._fault = fault or DiskFault()
        self._attempts = attempts

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info: Any
    ) -> None:
        self._deaths.result(trial, result)

    def on_trial_error(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        error = _trial_error(trial)
        if self._fault.met(error, trial.trial_id):
            return
        if node_lost(error):  # the world's doing: interrupted, replaced by the next run
            self._bridge.mark_interrupted(trial.trial_id, NODE_LOST)
        death = self._deaths.reason(trial, error, _log(trial))
        traceback = None if death else getattr(trial, "error_file", None)  # Ray's: no stack
        self._bridge.record_error(trial.trial_id, death or error_summary(error), traceback)

    def on_trial_start(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        log = _log(trial)
        if log:
            self._bridge.record_start(trial.trial_id, str(log))

    def on_trial_recover(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        error = _trial_error(trial)
        if self._fault.met(error, trial.trial_id):
            return
        death = self._deaths.reason(trial, error, _log(trial))
        if death and not node_lost(error):
            self._deaths.hold(trial)  # a lost node says nothing of the next attempt
        summary = error_summary(error)
        self._bridge.record_retry(trial.trial_id, death or summary)
        if death is None and not out_of_memory(summary) and NUMBER in trial.config:
            where = getattr(trial, "error_file", None)  # Ray's: the attempt's traceback
            self._attempts(Outcome(int(trial.config[NUMBER]), "FAIL", summary, where, True))


def _log(trial: Trial) -> Path | None:
    """The file of the trial's output (:mod:`search.tuning.output`)."""
    return Path(trial.path) / LOG_FILE if trial.path else None


def _trial_error(trial: Trial) -> BaseException | None:
    """The exception Ray just wrote beside the trial (``Trial.get_error`` reads the synced
    copy in storage, which may not exist yet)."""
    import cloudpickle

    path = trial.pickled_error_file
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            error = cloudpickle.load(f)
    except (OSError, EOFError, ValueError, AttributeError, ImportError):
        return None
    return error if isinstance(error, BaseException) else None


def running_template(
    driver: str, start: tuple[int, Mapping[str, Any]] | None = None
) -> optuna.trial.FrozenTrial:
    """The template a trial is created from: RUNNING from now, with its driver's id; with
    ``start`` (a ``sampler.start_from`` config and its index), the config's parameters fixed
    as Optuna's ``enqueue_trial`` fixes them.

    Example:
        >>> running_template("host/1a2b").state.name
        'RUNNING'
    """
    return optuna.trial.FrozenTrial(
        number=-1,
        state=TrialState.RUNNING,
        value=None,
        datetime_start=datetime.now(),
        datetime_complete=None,
        params={},
        distributions={},
        user_attrs={"driver": driver, **({START_FROM: start[0]} if start else {})},
        system_attrs={"fixed_params": dict(start[1])} if start else {},
        intermediate_values={},
        trial_id=-1,
    )
