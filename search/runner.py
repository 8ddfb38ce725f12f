"""Runs a study: wires spec, study, sampler, bridge, scheduler and Ray Tune, then fits.

Data flow of one trial: the bridge asks the study for a trial and samples the space on it;
Ray starts (or reuses) an actor that runs :func:`search.worker.run_trial`; every epoch the
trainable yields becomes one Tune report; ASHA reads it and may stop the trial; the bridge
records it as an intermediate value; when the trial ends the bridge tells the study its fate.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.bridge import ErrorCallback, OptunaBridge
from search.data import load_data
from search.progress import ProgressCallback
from search.resume import earlier_curves, recover
from search.samplers import grid_size
from search.scheduler import PruneReportingASHA, build_scheduler
from search.storage import redact
from search.study import open_study
from search.worker import TrialJob, run_trial

if TYPE_CHECKING:
    from ray.tune import Callback

    from search.data import Dataset
    from search.spec import StudySpec

# Tune's per-trial CSV/JSON/TensorBoard loggers cost time on every result and duplicate what
# the Optuna study records; Tune would also chdir each trial into its own folder, which breaks
# relative data paths in specs.
# RAY_AIR_NEW_OUTPUT=0 selects the reporter that honours verbose=0 (our ProgressCallback prints).
_RAY_ENV = {
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    "RAY_CHDIR_TO_TRIAL_DIR": "0",
    "RAY_AIR_NEW_OUTPUT": "0",
}


@dataclass(frozen=True)
class RunOptions:
    """How to run (not what to search): where Ray is, where files go, how loud."""

    results_dir: Path = Path("results")
    address: str | None = None
    verbose: int = 0
    progress: bool = True
    restart: bool = False
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


def init_ray(address: str | None, num_cpus: int | None = None) -> None:
    """Starts a local Ray (or joins ``address``) unless this process already has one."""
    import ray

    os.environ.update({k: v for k, v in _RAY_ENV.items() if k not in os.environ})
    if ray.is_initialized():
        return
    ray.init(
        address=address,
        num_cpus=None if address else num_cpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=False,
        runtime_env={"env_vars": dict(_RAY_ENV)},
    )


def _concurrency(spec: StudySpec) -> int:
    import ray

    if spec.resources.max_concurrent:
        return spec.resources.max_concurrent
    cpus = ray.cluster_resources().get("CPU", 1.0)
    return max(1, math.floor(cpus / spec.resources.cpus_per_trial))


def trial_extras(spec: StudySpec, data: Dataset) -> dict[str, Any]:
    """Spec-level options every trial may read through ``TrialContext.extras``."""
    return {
        "profile": spec.profile,
        "profile_trial": spec.profile_trial,
        "data_path": data.path,
        "image_size": data.image_size,
        "val_fraction": spec.data.val_fraction,
        "split_seed": spec.data.split_seed,
    }


def _progress(spec: StudySpec, bridge: OptunaBridge, options: RunOptions) -> list[Callback]:
    if not options.progress:
        return []
    objective = spec.objective
    return [ProgressCallback(bridge, objective.metric, objective.mode, spec.budget.trials)]


def run_study(spec: StudySpec, options: RunOptions = RunOptions()) -> RunSummary:
    """Runs ``spec`` to the end of its budget and returns a summary.

    Every trial this run started is COMPLETE, PRUNED or FAIL in the study when this returns.
    """
    import optuna
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.monotonic()
    study = open_study(spec, restart=options.restart)
    recovery = recover(study)
    budget = min(spec.budget.trials, grid_size(spec) or spec.budget.trials) - recovery.counted
    if budget <= 0:
        return RunSummary(spec.study, redact(spec.storage), 0.0, 0, recovery.interrupted)
    init_ray(options.address)
    if options.verbose == 0:  # trial errors reach the study and the console as one line each
        logging.getLogger("ray.tune").setLevel(logging.CRITICAL)
    data = load_data(spec.data)
    bridge = OptunaBridge(
        study,
        spec.space,
        spec.fixed,
        metric=spec.objective.metric,
        mode=spec.objective.mode,
        max_epochs=spec.budget.max_epochs,
        seed=spec.sampler.seed or 0,
    )
    job = TrialJob(
        trainable=spec.trainable,
        max_epochs=spec.budget.max_epochs,
        num_threads=max(1, int(spec.resources.cpus_per_trial)),
        checkpoints=spec.faults.checkpoints,
        extras=trial_extras(spec, data),
    )
    scheduler = build_scheduler(spec, bridge.mark_pruned)
    if isinstance(scheduler, PruneReportingASHA):
        scheduler.restore_rungs(earlier_curves(study))
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, job=job, data=data),
        {"cpu": spec.resources.cpus_per_trial, "gpu": spec.resources.gpus_per_trial},
    )
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=ConcurrencyLimiter(bridge, max_concurrent=_concurrency(spec)),
            scheduler=scheduler,
            num_samples=budget,
            time_budget_s=spec.budget.time_limit_s,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=spec.study,
            storage_path=str((options.results_dir / "ray").resolve()),
            callbacks=[
                ErrorCallback(bridge),
                *_progress(spec, bridge, options),
                *options.callbacks,
            ],
            verbose=options.verbose,
            failure_config=tune.FailureConfig(max_failures=spec.faults.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
        ),
    )
    try:
        tuner.fit()
    finally:
        bridge.finalize()
    return RunSummary(
        study_name=spec.study,
        storage=redact(spec.storage),
        seconds=time.monotonic() - start,
        trials_this_run=len(bridge.finished),
        interrupted=recovery.interrupted,
    )
