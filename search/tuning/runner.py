"""Runs a study: checks its knobs, opens it and takes its lease while Ray starts, recovers
what a dead driver left, then runs its trials (:mod:`search.tuning.fit`) and releases the lease.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from search.compute.cluster import init_ray, local_ray_processes
from search.compute.data import give_back_memory, load_data, share
from search.record.lease import StudyLease, new_run_id
from search.record.processes import mark
from search.record.resume import recover
from search.record.sampling.samplers import grid_size
from search.record.storage import redact
from search.record.study import open_study, record_spec
from search.record.tracking.mlflow_runs import TrialRun
from search.record.tracking.tracker import Tracker, track
from search.record.warm import earlier_study, import_trials
from search.specs.knobs import check_builtin_knobs, check_user_trainable
from search.tuning.fit import fit
from search.tuning.options import RunOptions, RunSummary
from search.tuning.signals import Termination

if TYPE_CHECKING:
    import optuna

    from search.contract import Dataset
    from search.specs.schema import StudySpec
    from search.tuning.bridge import Outcome


def run_study(spec: StudySpec, options: RunOptions = RunOptions()) -> RunSummary:
    """Runs ``spec`` to the end of its budget and returns a summary.

    The run holds the study's lease throughout (:mod:`search.record.lease`): a second driver is
    refused. Every trial this run started is COMPLETE, PRUNED or FAIL in the study when this
    returns.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.monotonic()
    # A built-in's knobs (checked by the CLI's preflight too, in a millisecond) stop a
    # misspelled one before Ray starts; a user trainable's are checked while Ray starts
    # (the CLI's preflight checked them before, and imported the trainable).
    builtin = check_builtin_knobs(spec, options.source)
    study, lease, data = _open_while_ray_starts(spec, options, knobs=not builtin)
    try:
        shared = share(data.result())  # the driver keeps no copy of its own
        del data
        give_back_memory()  # nor the memory that copy took
    except BaseException:  # the loader raised: a study this run created goes with it
        lease.release()
        _forget_if_new(study)
        raise
    tracker: Tracker | None = None
    try:
        record_spec(study, spec)
        import_trials(study, spec, options.source)
        recovery = recover(study)
        budget = min(spec.budget.trials, grid_size(spec) or spec.budget.trials) - recovery.counted
        termination = Termination()
        tracker = track(spec, study, options.results_dir)
        finished, stopped, hours = (
            fit(
                spec,
                options,
                study,
                lease.run_id,
                budget,
                shared,
                termination,
                _told(tracker),
                fence=lease.holds,
            )
            if budget > 0
            else ({}, None, None)
        )
        if lease.taken:  # another driver took the study: one line, TAKEN_EXIT_STATUS
            raise lease.taken_error()
    except BaseException:
        lease.release()
        if tracker is not None:  # the parent run ends KILLED, and the line still shows
            print(tracker.close("KILLED"), file=sys.stderr)
        raise
    lease.release()
    signalled = termination.received or termination.interrupted
    status = "KILLED" if signalled else "FAILED" if stopped else "FINISHED"
    tracked = tracker.close(status) if tracker is not None else None
    return RunSummary(
        study_name=spec.study,
        storage=redact(spec.storage),
        seconds=time.monotonic() - start,
        trials_this_run=len(finished),
        interrupted=recovery.interrupted,
        states=finished,
        stopped_early=stopped,
        device_hours=hours,
        terminated=termination.received,
        interrupted_by_user=termination.interrupted and not termination.received,
        tracking=tracked,
    )


def _told(tracker: Tracker | None) -> list[Callable[[Outcome], None]]:
    """The bridge listener that hands each trial's outcome to ``tracker`` (none without)."""
    if tracker is None:
        return []
    return [
        lambda done: tracker.trial(
            TrialRun(done.number, done.state, done.params, done.metrics, done.attrs)
        )
    ]


def _forget_if_new(study: optuna.Study) -> None:
    """Deletes ``study`` when this run created it (no spec recorded, no trial), so a run that
    failed before its first trial leaves nothing in the storage, nor in the dashboard's list."""
    import optuna

    if "spec" not in study.user_attrs and not study.get_trials(deepcopy=False):
        optuna.delete_study(study_name=study.study_name, storage=study._storage)


def _open(
    spec: StudySpec, options: RunOptions, knobs: bool = True, run_id: str = ""
) -> tuple[optuna.Study, StudyLease]:
    """Checks the spec's knobs against the trainable and that it is a generator (unless
    ``knobs`` is False: a built-in, checked already), then opens the study and takes its
    lease (:mod:`search.record.lease`). The check imports a user's trainable module, and its
    framework (seconds for PyTorch or TensorFlow; the CLI's preflight imported it already); a
    misspelled knob stops here, before the study exists."""
    if knobs:
        check_user_trainable(spec, options.source)
    if spec.warm_start is not None:
        earlier_study(spec, options.source)  # a missing one stops the run before the study
    study = open_study(spec, restart=options.restart, source=options.source)
    lease = StudyLease(spec.storage, spec.study, run_id or new_run_id())
    lease.acquire(options.takeover)
    return study, lease


def _open_while_ray_starts(
    spec: StudySpec, options: RunOptions, knobs: bool
) -> tuple[optuna.Study, StudyLease, Future[Dataset]]:
    """:func:`_open` and the data's loading in threads while this one starts Ray (or joins
    the cluster): each takes seconds (the trainable's import, the study's creation, the
    digits' import of scikit-learn), and none needs another. Ray starts in the main thread,
    where it sets its SIGTERM handler. The data comes as a future: a loader's error surfaces
    once the lease is held (and released however the run ends). ``knobs``: whether
    :func:`_open` checks the spec's knobs (a user's trainable; a built-in's are checked before)."""
    run_id = new_run_id()
    mark(run_id)  # the local Ray's processes carry it: the proof that they are this run's
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="search-start")
    try:
        opening = pool.submit(_open, spec, options, knobs, run_id)
        data = pool.submit(load_data, spec.data)
        try:
            started = init_ray(options.address)
        except BaseException:
            with contextlib.suppress(Exception):
                opening.result()[1].release()
            raise
        study, lease = opening.result()
        if started:  # a kill -9 of this driver leaves some behind: the next run stops them
            lease.keep(local_ray_processes())
        return study, lease, data
    finally:
        pool.shutdown(wait=False)
