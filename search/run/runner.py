"""Runs a study: wires spec, study, sampler, bridge, scheduler and Ray Tune, then fits.

Data flow of one trial: the bridge asks the study for a trial and samples the space on it;
Ray starts (or reuses) an actor that runs :func:`search.run.worker.run_trial`; every epoch the
trainable yields becomes one Tune report; ASHA reads it and may stop the trial; the bridge
records it as an intermediate value; when the trial ends the bridge tells the study its fate.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.contract import declarations
from search.record.lease import StudyLease, new_run_id
from search.record.queries import EPOCHS_FILE, append_epochs
from search.record.resume import earlier_curves, recover
from search.record.samplers import grid_size
from search.record.storage import redact
from search.record.study import open_study, record_spec
from search.record.writeback import WriteBehindStorage
from search.run.bridge import ErrorCallback, OptunaBridge
from search.run.cluster import init_ray
from search.run.data import load_data
from search.run.gpu_memory import OOM_RETRIES, OomRetry, measure
from search.run.job import trial_extras, trial_job
from search.run.placement import Placement, resolve
from search.run.progress import ProgressCallback
from search.run.scheduler import PruneReportingASHA, build_scheduler
from search.run.stopping import FIRST, FailFast, RunStopper
from search.run.worker import run_trial
from search.spec.derive import asha_milestones

if TYPE_CHECKING:
    import optuna
    from ray.tune import Callback

    from search.contract import Dataset
    from search.spec.schema import StudySpec


@dataclass(frozen=True)
class RunOptions:
    """How to run (not what to search): where Ray is, where files go, how loud."""

    results_dir: Path = Path("results")
    address: str | None = None
    verbose: int = 0
    progress: bool = True
    restart: bool = False
    takeover: bool = False
    """Take the study's lease even from a driver that looks alive."""
    source: str = "spec"
    """Where the spec came from, for error lines."""
    callbacks: Sequence[Callback] = ()


@dataclass(frozen=True)
class RunSummary:
    """What a finished run reports."""

    study_name: str
    storage: str
    seconds: float
    trials_this_run: int
    interrupted: tuple[int, ...] = ()
    """Trials an earlier, dead driver left open, now FAIL and replaced."""
    states: dict[int, str] = field(default_factory=dict)
    """Optuna trial number -> final state name, for each trial this run finished."""
    stopped_early: str | None = None
    """Why the run stopped before its budget (its first trials all failed alike), if it did."""


def place(spec: StudySpec, data: Dataset) -> Placement:
    """Resolves the spec's ``resources`` on the cluster Ray runs (:mod:`search.run.placement`);
    ``gpus_per_trial: auto`` on GPUs first measures the largest config on one GPU."""
    import ray

    res, cluster = spec.resources, ray.cluster_resources()
    measured = None
    if res.gpus_per_trial == "auto" and cluster.get("GPU", 0) > 0:
        measured = measure(spec, data, trial_extras(spec, data))
    several = (res.workers_per_trial or 1) > 1 or (
        res.gpus_per_trial != "auto" and res.gpus_per_trial >= 2
    )
    mode = declarations(spec.trainable).data_parallel if several else None
    return resolve(res, cluster, measured, data_parallel=mode)


def _progress(spec: StudySpec, bridge: OptunaBridge, options: RunOptions) -> list[Callback]:
    if not options.progress:
        return []
    objective, budget, asha = spec.objective, spec.budget, spec.asha
    rungs = (
        asha_milestones(asha.grace_period, asha.reduction_factor, budget.max_epochs)
        if asha.enabled
        else []
    )
    return [
        ProgressCallback(
            bridge,
            objective.metric,
            objective.mode,
            budget.trials,
            milestones=rungs,
            max_epochs=budget.max_epochs,
            time_limit_s=budget.time_limit_s,
        )
    ]


def run_study(spec: StudySpec, options: RunOptions = RunOptions()) -> RunSummary:
    """Runs ``spec`` to the end of its budget and returns a summary.

    The run holds the study's lease throughout (:mod:`search.record.lease`): a second driver is
    refused. Every trial this run started is COMPLETE, PRUNED or FAIL in the study when this
    returns.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.monotonic()
    study = open_study(spec, restart=options.restart, source=options.source)
    lease = StudyLease(spec.storage, spec.study, new_run_id())
    lease.acquire(options.takeover)
    try:
        record_spec(study, spec)
        recovery = recover(study)
        budget = min(spec.budget.trials, grid_size(spec) or spec.budget.trials) - recovery.counted
        finished, stopped = (
            _fit(spec, options, study, lease.run_id, budget) if budget > 0 else ({}, None)
        )
    finally:
        lease.release()
    return RunSummary(
        study_name=spec.study,
        storage=redact(spec.storage),
        seconds=time.monotonic() - start,
        trials_this_run=len(finished),
        interrupted=recovery.interrupted,
        states=finished,
        stopped_early=stopped,
    )


def _fit(
    spec: StudySpec, options: RunOptions, study: optuna.Study, run_id: str, budget: int
) -> tuple[dict[int, str], str | None]:
    """Runs ``budget`` trials through Ray Tune; returns each one's number and final state, and
    why the run stopped early (``None`` when it did not)."""
    import optuna

    init_ray(options.address)
    # Trial writes (attributes, intermediate values, final state) leave Tune's loop: a
    # background thread commits them in order (search/record/writeback.py).
    storage = WriteBehindStorage(study._storage)
    study = optuna.Study(study_name=spec.study, storage=storage, sampler=study.sampler)
    if options.verbose == 0:  # trial errors reach the study and the console as one line each
        logging.getLogger("ray.tune").setLevel(logging.CRITICAL)
    data = load_data(spec.data)
    placement = place(spec, data)
    if options.progress and placement.note:
        print(placement.note, file=sys.stderr)
    watch = FailFast(min(FIRST, budget))
    table = options.results_dir / spec.study / EPOCHS_FILE
    bridge = OptunaBridge(
        study,
        spec.space,
        spec.fixed,
        metric=spec.objective.metric,
        mode=spec.objective.mode,
        max_epochs=spec.budget.max_epochs,
        seed=spec.sampler.seed or 0,
        run_id=run_id,
        listeners=[watch, lambda done: append_epochs(table, done.number, done.metrics)],
    )
    stopper = RunStopper(spec.budget.time_limit_s, bridge.mark_interrupted, lambda: watch.verdict)
    tuner = _tuner(spec, options, bridge, placement, data, stopper, budget)
    try:
        tuner.fit()
    finally:
        try:
            cause = "time limit" if stopper.expired else "interrupt"
            bridge.finalize("run stopped early" if watch.verdict else cause)
        finally:
            storage.close()
    return dict(bridge.finished.values()), watch.verdict


def _tuner(
    spec: StudySpec,
    options: RunOptions,
    bridge: OptunaBridge,
    placement: Placement,
    data: Dataset,
    stopper: RunStopper,
    budget: int,
) -> Any:
    """The Tune ``Tuner``: the trainable with its resources, ASHA (rungs refilled on a resume),
    the bridge as searcher, retries, and our callbacks."""
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter

    scheduler = build_scheduler(spec, bridge.mark_pruned)
    if isinstance(scheduler, PruneReportingASHA):
        scheduler.restore_rungs(earlier_curves(bridge.study))
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, job=trial_job(spec, data, placement), data=data),
        placement.ray_resources,
    )
    packed = 0 < placement.gpus_per_trial < 1  # an out-of-memory trial retries with more GPU
    max_failures = max(spec.faults.max_failures, OOM_RETRIES if packed else 0)
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=ConcurrencyLimiter(bridge, max_concurrent=placement.concurrency),
            scheduler=scheduler,
            num_samples=budget,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=spec.study,
            storage_path=str((options.results_dir / "ray").resolve()),
            callbacks=[
                ErrorCallback(bridge),
                *([OomRetry()] if packed else []),
                *_progress(spec, bridge, options),
                *options.callbacks,
            ],
            verbose=options.verbose,
            stop=stopper,
            failure_config=tune.FailureConfig(max_failures=max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
        ),
    )
