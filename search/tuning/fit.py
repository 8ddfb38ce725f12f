"""Runs a study's trials through Ray Tune, once the study is open and Ray is up.

:func:`fit` wires the bridge, the scheduler, the stoppers and our callbacks into a Tune
``Tuner`` and runs it. This module imports Ray Tune (over a second here), and so does
:mod:`search.tuning.runner`, which imports it: the CLI imports the runner only once its preflight
passed (:func:`search.tuning.preflight.check_run`).

Data flow of one trial: the bridge asks the study for a trial and samples the space on it;
Ray starts (or reuses) an actor that runs :func:`search.tuning.worker.run_trial`; every epoch the
trainable yields becomes one Tune report; ASHA reads it and may stop the trial; the bridge
records it as an intermediate value; when the trial ends the bridge tells the study its fate.
A trial silent for longer than ``faults.stall_s`` is killed as hung (:mod:`search.tuning.stall`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from search.compute.cluster import init_ray, untagged_callbacks
from search.compute.gpu_memory import largest_config, measure
from search.compute.gpu_rates import measure_rates
from search.compute.job import trial_job
from search.compute.placement import Placement, auto_packing, resolve
from search.contract import RESERVED_PREFIX, declarations
from search.contract.registry import declared_defaults
from search.record.folders import study_folder
from search.record.queries import EPOCHS_FILE, append_epochs, objective_curves, read_epochs
from search.record.resume import earlier_curves
from search.record.sampling.samplers import configure
from search.record.warm import pending_start
from search.record.writeback import WriteBehindStorage
from search.specs.derive import asha_milestones
from search.tuning.actors import inherited_env
from search.tuning.bridge import ErrorCallback, OptunaBridge, Outcome
from search.tuning.fate import NUMBER
from search.tuning.faults import DiskFault
from search.tuning.fusion import (
    Fusion,
    leave_callback,
    member_job,
    member_placement,
    start_hosts,
    stop_hosts,
)
from search.tuning.fusion_auto import decide_fuse
from search.tuning.moasha import MultiObjectiveASHA
from search.tuning.oom import OOM_RETRIES, OomRetry
from search.tuning.output import attach_output
from search.tuning.progress import ProgressCallback
from search.tuning.scheduler import PruneReportingASHA, build_scheduler
from search.tuning.stall import StallWatch, StopStragglers
from search.tuning.stopping import StopLedger
from search.tuning.worker import run_trial

if TYPE_CHECKING:
    from pathlib import Path

    import optuna
    from ray.tune import Callback, Stopper
    from ray.tune.experiment import Trial

    from search.compute.data import SharedData
    from search.specs.schema import StudySpec
    from search.tuning.options import RunOptions
    from search.tuning.signals import Termination


def fit(
    spec: StudySpec,
    options: RunOptions,
    study: optuna.Study,
    run_id: str,
    budget: int,
    data: SharedData,
    termination: Termination | None = None,
    listeners: Sequence[Callable[[Outcome], None]] = (),
    fence: Callable[[bool], bool] | None = None,
) -> tuple[dict[int, str], str | None, tuple[float, float, str] | None]:
    """Runs ``budget`` trials through Ray Tune; returns each one's number and final state, why
    the run stopped early (``None`` when it did not), and the device-hours spent against the
    spec's device budget (``None`` without one). ``termination`` records whether SIGTERM
    stopped the run (:mod:`search.tuning.signals`); ``listeners`` are told each trial's
    :class:`~search.tuning.bridge.Outcome` once the study holds it; ``fence`` says whether
    this run still holds the study's lease (:class:`~search.tuning.bridge.OptunaBridge`): once
    another driver took the study, the run stops at once and writes none of its trials.
    Every source that stops the run is settled by one :class:`~search.tuning.stopping.
    StopLedger`."""
    import optuna

    init_ray(options.address)
    # Trial writes (attributes, intermediate values, final state) leave Tune's loop: a
    # background thread commits them in order (search/record/writeback.py).
    storage = WriteBehindStorage(study._storage)
    study = optuna.Study(study_name=spec.study, storage=storage, sampler=study.sampler)
    if options.verbose == 0:  # trial errors reach the study and the console as one line each
        logging.getLogger("ray.tune").setLevel(logging.CRITICAL)
    placement = place(spec, data)
    fuse = decide_fuse(spec, placement, data)  # resources.fuse: auto decides here
    fusion: Fusion | None = None
    hosts: list[Any] = []
    if fuse.members:  # trials of one shape train as one model (search/tuning/fusion.py)
        fusion, hosts = start_hosts(spec, placement, data, run_id, fuse.members)
        placement = member_placement(placement, fusion)
    configure(study, placement.concurrency)  # an auto sampler's plan for K trials at once
    for line in (fuse.line, placement.note) if options.progress else ():
        if line:
            print(line, file=sys.stderr)
    ledger = StopLedger(spec, budget, options.source, termination)
    bridge = _bridge(spec, options, study, run_id, ledger, listeners, fence)
    ledger.attach(bridge, placement)
    progress = _progress(spec, bridge, options)
    errors = ErrorCallback(bridge, ledger.disk, ledger.fail_fast.attempt)
    watchers = [errors, StopStragglers(ledger.stopped)]
    stopper = ledger.stopper
    if fusion is not None:
        watchers.append(leave_callback(fusion))
    tuner = _tuner(
        spec, options, bridge, placement, data, stopper, budget, watchers, progress, fusion
    )
    places = [str(options.results_dir), spec.storage]  # where a full disk may be
    try:
        with ledger.settling(storage, progress, places), untagged_callbacks(), inherited_env():
            tuner.fit()
    finally:
        stop_hosts(hosts)
    return dict(bridge.finished.values()), ledger.verdict(), ledger.device_hours()


def _bridge(
    spec: StudySpec,
    options: RunOptions,
    study: optuna.Study,
    run_id: str,
    ledger: StopLedger,
    listeners: Sequence[Callable[[Outcome], None]],
    fence: Callable[[bool], bool] | None,
) -> OptunaBridge:
    """The run's searcher. Each trial's outcome goes to the ledger's watches, its epochs to
    ``epochs.csv`` (a full disk there goes to the ledger), its output to the dashboard, then
    to ``listeners``."""
    table = study_folder(options.results_dir, spec.study) / EPOCHS_FILE

    def attach(done: Outcome) -> None:
        # the bridge's study, read when a trial ends: Ray pickles the bridge and its
        # listeners (tuner.pkl), and the bridge leaves its study (and storage) out
        attach_output(bridge.study, done.number, done.log, options.results_dir)

    bridge = OptunaBridge(
        study,
        spec.space,
        spec.fixed,
        metric=spec.primary.metric,
        mode=spec.primary.mode,
        max_epochs=spec.budget.max_epochs,
        objectives=[o.metric for o in spec.objectives[1:]],
        seed=spec.sampler.seed or 0,
        run_id=run_id,
        listeners=[*ledger.listeners, _epochs_table(table, ledger.disk), attach, *listeners],
        start=pending_start(study, spec),
        fence=fence,
    )
    return bridge


def _epochs_table(table: Path, fault: DiskFault) -> Callable[[Outcome], None]:
    """The listener that appends a finished trial's epochs to ``epochs.csv``; a full disk
    there goes to ``fault`` (the run stops), not into Tune's loop."""

    def append(done: Outcome) -> None:
        try:
            append_epochs(table, done.number, done.metrics)
        except OSError as exc:
            if not fault.met(exc):
                raise

    return append


def _tuner(
    spec: StudySpec,
    options: RunOptions,
    bridge: OptunaBridge,
    placement: Placement,
    data: SharedData,
    stopper: Stopper,
    budget: int,
    watchers: list[Callback],
    progress: list[ProgressCallback],
    fusion: Fusion | None = None,
) -> Any:
    """The Tune ``Tuner``: the trainable with its resources, ASHA (rungs refilled on a resume),
    the bridge as searcher, retries, and our callbacks (``watchers`` first, ``progress`` after
    the stall watch). With ``fusion``, each trial runs a member of a fused array."""
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter

    scheduler = build_scheduler(spec, bridge.mark_pruned)
    if isinstance(scheduler, PruneReportingASHA):
        scheduler.restore_rungs(earlier_curves(bridge.study))
    elif isinstance(scheduler, MultiObjectiveASHA):  # no intermediate values: the epochs table
        table = read_epochs(study_folder(options.results_dir, spec.study) / EPOCHS_FILE)
        scheduler.restore_rungs(objective_curves(table, [o.metric for o in spec.objectives]))
    packed = 0 < placement.gpus_per_trial < 1  # an out-of-memory trial retries with more GPU
    max_failures = max(spec.faults.max_failures, OOM_RETRIES if packed else 0)
    job = trial_job(spec, data, placement)
    if max_failures == 0:  # no retry would read a checkpoint: the trainable saves none
        job = replace(job, checkpoints=False)
    if fusion is not None:
        job = member_job(job, fusion, declared_defaults(spec.trainable) or {})
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, job=job, data=data.ref), placement.ray_resources
    )
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=ConcurrencyLimiter(bridge, max_concurrent=placement.concurrency),
            scheduler=scheduler,
            num_samples=budget,
            reuse_actors=True,
            trial_name_creator=trial_name,
            trial_dirname_creator=trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=spec.study,
            storage_path=str((options.results_dir / "ray").resolve()),
            callbacks=[
                *watchers,
                StallWatch(spec.faults.stall_s, bridge.mark_stalled),
                *([OomRetry()] if packed else []),
                *progress,
                *options.callbacks,
            ],
            verbose=options.verbose,
            stop=stopper,
            failure_config=tune.FailureConfig(max_failures=max_failures),
            # Tune snapshots the whole experiment (every trial's state, as JSON) each time one
            # trial has made num_to_keep checkpoints since the last snapshot: with 1 that is
            # every checkpoint, a cost that grows with the trials. The worker checkpoints at
            # most every faults.checkpoint_every_s, so with 2 the periodic snapshot comes first.
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        ),
    )


def trial_name(trial: Trial) -> str:
    """``trial_3``: the study's trial number (Ray's own count starts at 1, and runs on across
    the runs of a study); Ray's trial id when the config has none."""
    number = trial.config.get(NUMBER)
    return f"trial_{number}" if number is not None else f"trial_{trial.trial_id}"


def trial_dirname(trial: Trial) -> str:
    """The trial's folder under ``results/ray/<study>/``: ``trial_3_lr=0.0354,units=16_8a2f1c3e``
    (:func:`trial_name`, its sampled and fixed values, cut at :data:`PARAMS_IN_DIRNAME`
    characters, and Ray's trial id, which keeps it unique)."""
    shown = ",".join(
        f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"
        for key, value in trial.config.items()
        if not key.startswith(RESERVED_PREFIX)
    )
    shown = shown[:PARAMS_IN_DIRNAME].replace(os.sep, "_")  # a path as a value
    parts = (trial_name(trial), shown, trial.trial_id)
    return "_".join(part for part in parts if part)


PARAMS_IN_DIRNAME = 100
"""The most characters of a trial's values in its folder's name."""


def place(spec: StudySpec, data: SharedData) -> Placement:
    """Resolves the spec's ``resources`` on the cluster Ray runs (:mod:`search.compute.placement`);
    ``gpus_per_trial: auto`` on GPUs first measures the largest config on one GPU."""
    import ray

    res, cluster = spec.resources, ray.cluster_resources()
    measured = None
    if res.gpus_per_trial == "auto" and cluster.get("GPU", 0) > 0:
        measured = measure(spec, data)
        if measured is not None:  # then by throughput, among the counts that fit
            fit = auto_packing(res, cluster, measured)[0].trials_per_gpu
            config = largest_config(spec.space, spec.fixed)
            rates = measure_rates(spec, data, config, fit, measured.total_bytes)
            measured = dataclasses.replace(measured, rates=tuple(sorted(rates.items())))
    several = (res.workers_per_trial or 1) > 1 or (
        res.gpus_per_trial != "auto" and res.gpus_per_trial >= 2
    )
    mode = declarations(spec.trainable).data_parallel if several else None
    return resolve(res, cluster, measured, data_parallel=mode)


def _progress(spec: StudySpec, bridge: OptunaBridge, options: RunOptions) -> list[ProgressCallback]:
    if not options.progress:
        return []
    objective, budget, asha = spec.primary, spec.budget, spec.asha
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
            notebook=options.notebook,
        )
    ]
