"""The two contenders of the bookkeeping and throughput modes, each run in its own driver
process joined to the benchmark's Ray head:

    ours    ``search.tuning.runner.run_study`` (TPE on SQLite through the bridge, ASHA or FIFO)
    stock   Ray Tune as users write it: OptunaSearch (TPE, in memory) in a ConcurrencyLimiter,
            ``reuse_actors``, ASHAScheduler or FIFO

Both train ``benchmarks.scale_trainables.ticker`` (``search.testing.curve`` stamped with its
send time). A Tune callback counts the results the driver received per trial; at the end the
study is checked against it (the truthful record: no trial RUNNING or WAITING, one
intermediate value per reported epoch).
"""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ray.tune import Callback

TRAINABLE = "benchmarks.scale_trainables:ticker"


@dataclass(frozen=True)
class Job:
    """One run of one contender: ``trials`` trials of ``epochs`` epochs sleeping ``sleep`` s."""

    trials: int
    epochs: int
    sleep: float
    concurrency: int
    asha: bool
    address: str
    folder: str
    checkpoints: bool = True


class Tap(Callback):
    """Counts each trial's results and how long after its send the driver got each, and the
    processes that ran trials (each a Ray actor: Tune reuses one for a new trial only when it
    is cached at the moment the old trial stops)."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self.results: dict[str, int] = {}
        self.sent: dict[int, list[float]] = {}  # trial number -> send time of each epoch
        self.lags: list[float] = []

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        if "sent_at" not in result:
            return
        self.pids.add(int(result.get("worker_pid", 0)))
        self.results[trial.trial_id] = self.results.get(trial.trial_id, 0) + 1
        self.lags.append(time.time() - result["sent_at"])
        self.sent.setdefault(int(result["number"]), []).append(result["sent_at"])


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _truth(trials: list[Any], ray_ids: dict[int, str], tap: Tap) -> dict[str, Any]:
    """The record against what the driver received: open trials, and trials whose
    intermediate values are not exactly one per reported epoch."""
    open_ = sum(t.state.name in ("RUNNING", "WAITING") for t in trials)
    wrong = 0
    for t in trials:
        reported = tap.results.get(ray_ids.get(t.number, ""), 0)
        if sorted(t.intermediate_values) != list(range(1, reported + 1)):
            wrong += 1
    return {"open": open_, "wrong_curves": wrong, "trials_recorded": len(trials)}


def _ours_spec(job: Job, name: str) -> Any:
    from search.specs.schema import parse_spec

    return parse_spec(
        {
            "study": name,
            "trainable": TRAINABLE,
            "objective": {"metric": "val_accuracy", "mode": "max"},
            "budget": {"trials": job.trials, "max_epochs": job.epochs},
            "asha": {"enabled": job.asha, "grace_period": 1, "reduction_factor": 3},
            "sampler": {"name": "tpe", "seed": 0},
            "resources": {"cpus_per_trial": 1, "max_concurrent": job.concurrency},
            "faults": {"checkpoints": job.checkpoints},
            "storage": f"sqlite:///{job.folder}/optuna.db",
            "fixed": {"sleep": job.sleep},
            "space": {"x": {"uniform": [0.0, 1.0]}},
        }
    )


def _poll_sqlite(path: str, tap: Tap, stop: threading.Event, out: list[float]) -> None:
    """Every 0.5 s, for each running trial: the age of the newest intermediate value the study
    holds (an upper bound on the lag of that value: it also counts the wait for the next)."""
    import sqlite3

    query = (
        "SELECT t.number, COUNT(v.step) FROM trials t JOIN trial_intermediate_values v "
        "ON v.trial_id = t.trial_id WHERE t.state = 'RUNNING' GROUP BY t.number"
    )
    while not stop.wait(0.5):
        try:
            with sqlite3.connect(path, timeout=1.0) as db:
                rows = db.execute(query).fetchall()
        except sqlite3.Error:
            continue
        now = time.time()
        for number, count in rows:
            sends = tap.sent.get(number, [])
            if 0 < count <= len(sends):
                out.append(now - sends[count - 1])


def run_ours(job: Job) -> dict[str, Any]:
    """Runs ``job`` through this project; wall, driver CPU, lags and the truth check."""
    from search.compute import cluster
    from search.tuning.runner import RunOptions, init_ray, run_study

    if os.environ.get("SCALE_BEFORE"):  # the trials import the same tree as this driver
        cluster._RAY_ENV["PYTHONPATH"] = os.environ["PYTHONPATH"]
    init_ray(job.address)
    tap, staleness, stop = Tap(), [], threading.Event()
    poller = threading.Thread(
        target=_poll_sqlite, args=(f"{job.folder}/optuna.db", tap, stop, staleness), daemon=True
    )
    spec = _ours_spec(job, f"ours-{int(job.asha)}")
    options = RunOptions(results_dir=Path(job.folder) / "r", progress=False, callbacks=[tap])
    cpu, start = _cpu(), time.perf_counter()
    poller.start()
    run_study(spec, options)
    wall = time.perf_counter() - start
    stop.set()
    from search.record.study import load_study

    trials = load_study(spec.study, spec.storage).get_trials(deepcopy=False)
    ids = {t.number: str(t.user_attrs.get("ray_trial_id", "")) for t in trials}
    return _summary(job, wall, _cpu() - cpu, trials, ids, tap, staleness)


def _tune_ticker(config: dict[str, Any], sleep: float, epochs: int) -> None:
    from ray import tune

    from benchmarks.scale_trainables import ticker
    from search.contract import TrialContext

    number = abs(hash(tune.get_context().get_trial_id())) % 10**9
    ctx = TrialContext(max_epochs=epochs, trial_number=number)
    for metrics in ticker({**config, "sleep": sleep}, None, ctx):
        tune.report(metrics)


def _stock_tuner(job: Job, tap: Tap) -> tuple[Any, Any]:
    import optuna
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    searcher = OptunaSearch(sampler=optuna.samplers.TPESampler(seed=0))
    scheduler = (
        ASHAScheduler(max_t=job.epochs, grace_period=1, reduction_factor=3)
        if job.asha
        else FIFOScheduler()
    )
    tuner = tune.Tuner(
        tune.with_parameters(_tune_ticker, sleep=job.sleep, epochs=job.epochs),
        param_space={"x": tune.uniform(0.0, 1.0)},
        tune_config=tune.TuneConfig(
            metric="val_accuracy",
            mode="max",
            search_alg=ConcurrencyLimiter(searcher, max_concurrent=job.concurrency),
            scheduler=scheduler,
            num_samples=job.trials,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=f"stock-{int(job.asha)}",
            storage_path=f"{job.folder}/ray",
            callbacks=[tap],
            verbose=0,
        ),
    )
    return tuner, searcher


def run_stock(job: Job) -> dict[str, Any]:
    """Runs ``job`` through stock Ray Tune; the same measures as :func:`run_ours` (its study is
    OptunaSearch's in-memory one, written in Tune's loop: its lag is the driver's)."""
    import ray

    ray.init(address=job.address, log_to_driver=False)
    tap = Tap()
    tuner, searcher = _stock_tuner(job, tap)
    cpu, start = _cpu(), time.perf_counter()
    tuner.fit()
    wall = time.perf_counter() - start
    study = searcher._ot_study
    ids = {ot.number: trial_id for trial_id, ot in searcher._ot_trials.items()}
    trials = study.get_trials(deepcopy=False)
    return _summary(job, wall, _cpu() - cpu, trials, ids, tap, list(tap.lags))


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def _summary(
    job: Job,
    wall: float,
    cpu: float,
    trials: list[Any],
    ids: dict[int, str],
    tap: Tap,
    study_lags: list[float],
) -> dict[str, Any]:
    epochs = sum(tap.results.values())
    return {
        **asdict(job),
        "wall_s": round(wall, 2),
        "ideal_s": round(epochs * job.sleep / job.concurrency, 2),
        "epochs_reported": epochs,
        "results_per_s": round(sum(len(t.intermediate_values) for t in trials) / wall, 1),
        "driver_cpu_share": round(cpu / wall, 3),
        "actors": len(tap.pids),
        "driver_lag_p50_s": _pct(tap.lags, 0.5),
        "driver_lag_p95_s": _pct(tap.lags, 0.95),
        "study_lag_p50_s": _pct(study_lags, 0.5),
        "study_lag_p95_s": _pct(study_lags, 0.95),
        **_truth(trials, ids, tap),
    }
