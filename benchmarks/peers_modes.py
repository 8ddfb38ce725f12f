"""The fixed-work mode of ``benchmarks/peers.py`` and its stock Ray Tune TPE contender.

Fixed work: every epoch does the same single-thread torch work (``scale_trainables.fixed_work``,
calibrated to ``--work`` seconds) whatever the config, 16 trials x 27 epochs, 2 at a time, ASHA
off, so the contenders differ only in what they add around it. Each contender runs in its own
process and times its own study call (Ray already up, for the Ray-based ones):

    search   ``run_study`` (TPE on SQLite through the bridge)
    ray      stock Ray Tune: OptunaSearch TPE (in memory), ``max_concurrent_trials``, reuse_actors
    optuna   Optuna in one process, TPE, ``n_jobs`` threads (torch releases the GIL)

Reported: wall / pure compute (trials x epochs x work / concurrency), and each contender's
start-up (call to first epoch), steady state and teardown (last epoch to return).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

TRAINABLE = "benchmarks.scale_trainables:fixed_work"
FIXED_CONTENDERS = ("search", "ray", "optuna")


def _phases(start: float, times: list[float]) -> dict[str, float]:
    end = time.perf_counter()
    first, last = (min(times), max(times)) if times else (end, end)
    return {
        "wall_s": end - start,
        "startup_s": first - start,
        "steady_s": last - first,
        "teardown_s": end - last,
        "epochs": len(times),
    }


def _fixed_search(n: int, epochs: int, cpus: int, reps: int, tmp: Path) -> dict[str, float]:
    from ray.tune import Callback

    from search.specs.schema import parse_spec
    from search.tuning.runner import RunOptions, init_ray, run_study

    times: list[float] = []

    class Tap(Callback):
        def on_trial_result(
            self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
        ) -> None:  # noqa: E501
            times.append(time.perf_counter())

    spec = parse_spec(
        {
            "study": "fixed",
            "trainable": TRAINABLE,
            "objective": {"metric": "val_accuracy", "mode": "max"},
            "budget": {"trials": n, "max_epochs": epochs},
            "asha": {"enabled": False},
            "resources": {"cpus_per_trial": 1, "max_concurrent": cpus},
            "storage": f"sqlite:///{tmp}/optuna.db",
            "fixed": {"reps": reps},
            "space": {"x": {"uniform": [0.0, 1.0]}},
        }
    )
    init_ray(None, num_cpus=cpus)
    start = time.perf_counter()
    run_study(spec, RunOptions(results_dir=tmp / "r", progress=False, callbacks=[Tap()]))
    return _phases(start, times)


def _tune_fixed(config: dict[str, Any], reps: int, epochs: int) -> None:
    from ray import tune

    from benchmarks.scale_trainables import fixed_work
    from search.contract import TrialContext

    for metrics in fixed_work({**config, "reps": reps}, None, TrialContext(max_epochs=epochs)):
        tune.report(metrics)


def _fixed_ray(n: int, epochs: int, cpus: int, reps: int, tmp: Path) -> dict[str, float]:
    import optuna
    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    times: list[float] = []

    class Tap(tune.Callback):
        def on_trial_result(
            self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
        ) -> None:  # noqa: E501
            times.append(time.perf_counter())

    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    tuner = tune.Tuner(
        tune.with_parameters(_tune_fixed, reps=reps, epochs=epochs),
        param_space={"x": tune.uniform(0.0, 1.0)},
        tune_config=tune.TuneConfig(
            metric="val_accuracy",
            mode="max",
            search_alg=OptunaSearch(sampler=optuna.samplers.TPESampler(seed=0)),
            num_samples=n,
            max_concurrent_trials=cpus,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(storage_path=str(tmp / "ray"), callbacks=[Tap()], verbose=0),
    )
    start = time.perf_counter()
    tuner.fit()
    return _phases(start, times)


def _fixed_optuna(n: int, epochs: int, cpus: int, reps: int, tmp: Path) -> dict[str, float]:
    import optuna

    from benchmarks.scale_trainables import fixed_work
    from search.contract import TrialContext

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    times: list[float] = []

    def objective(trial: Any) -> float:
        value = 0.0
        config = {"x": trial.suggest_float("x", 0.0, 1.0), "reps": reps}
        for epoch, metrics in enumerate(
            fixed_work(config, None, TrialContext(max_epochs=epochs)), 1
        ):
            value = metrics["val_accuracy"]
            trial.report(value, epoch)
            times.append(time.perf_counter())
        return value

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    start = time.perf_counter()
    study.optimize(objective, n_trials=n, n_jobs=cpus)
    return _phases(start, times)


def run_fixed(name: str, n: int, epochs: int, cpus: int, reps: int, tmp: Path) -> dict[str, float]:
    """One contender's fixed-work run: wall, start-up, steady, teardown seconds, epochs."""
    run = {"search": _fixed_search, "ray": _fixed_ray, "optuna": _fixed_optuna}[name]
    return run(n, epochs, cpus, reps, tmp)


def print_fixed(rows: list[dict[str, Any]], pure: float) -> None:
    """The fixed-work table: wall / pure compute and the phases, one row per contender."""
    print(f"\nfixed work: pure compute {pure:.1f} s (trials x epochs x work / concurrency)")
    print(
        f"{'contender':<8} {'wall s':>7} {'x pure':>7} {'excess s':>8} {'startup':>8} "
        f"{'steady':>7} {'teardown':>8} {'epochs':>6}"
    )
    for r in rows:
        print(
            f"{r['contender']:<8} {r['wall_s']:>7.1f} {r['wall_s'] / pure:>7.2f} "
            f"{r['wall_s'] - pure:>8.1f} {r['startup_s']:>8.1f} {r['steady_s']:>7.1f} "
            f"{r['teardown_s']:>8.1f} {r['epochs']:>6}"
        )
