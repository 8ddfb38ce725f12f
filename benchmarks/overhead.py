"""Orchestration overhead per trial: this project vs stock Ray Tune vs Optuna in one process.

Every contender runs the same trivial trainable (``search.testing:instant``: one epoch, no
work), each in its own subprocess so that one's settings cannot leak into another's: a
warm-up run of ``--warmup`` trials (Ray started, workers spawned, imports paid), then a timed
small run of ``--warmup`` trials and a timed run of ``--trials`` trials. What a trial costs is
then all orchestration:

    ms/trial   marginal cost of one more trial: (t_big - t_small) / (trials - warmup)
    fixed s    what a run costs on top (Tuner set-up, new actors, teardown)
    run ms/tr  t_big / trials: the whole warm run divided by its trials

    python benchmarks/overhead.py                  # 100 trials each, ~5 min on 2 cores
    python benchmarks/overhead.py --trials 200 --repeats 2

Contenders:
    search        this project: Optuna TPE through the bridge, ASHA, SQLite storage
    ray-stock     Ray Tune as it comes: OptunaSearch (TPE, in memory), ASHAScheduler,
                  default TuneConfig/RunConfig (new actor per trial, CSV/JSON/TB loggers)
    ray-floor     Ray Tune's own floor: random search, reused actors, loggers off
    optuna-mem    Optuna in one process, TPE, in-memory storage, trials one after another
    optuna-sqlite the same with a SQLite storage

Prints a table (ratios against this project), writes results/benchmarks/overhead.csv and
overhead.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "results" / "benchmarks"
CONTENDERS = ("search", "ray-stock", "ray-floor", "optuna-mem", "optuna-sqlite")
LABELS = {
    "search": "this project (TPE + ASHA, SQLite)",
    "ray-stock": "Ray Tune stock (OptunaSearch + ASHA, defaults)",
    "ray-floor": "Ray Tune floor (random, reuse, no loggers)",
    "optuna-mem": "Optuna, one process, in memory",
    "optuna-sqlite": "Optuna, one process, SQLite",
}


# ---- the contenders (each runs in its own subprocess) ---------------------------------------


def _instant_objective(trial: Any) -> float:
    from search.contract import TrialContext
    from search.specs.space import Param, sample
    from search.testing import instant

    params = sample(trial, {"x": Param(uniform=(0.0, 1.0))})
    value = 0.0
    for epoch, metrics in enumerate(instant(params, None, TrialContext(max_epochs=1)), 1):
        value = metrics["val_accuracy"]
        trial.report(value, epoch)
    return value


def _timed(run: Any, trials: int, warmup: int) -> tuple[float, float]:
    """``run(name, n)`` warm-up, then timed at ``warmup`` and at ``trials`` trials."""
    run("warm", warmup)
    start = time.perf_counter()
    run("small", warmup)
    small = time.perf_counter() - start
    start = time.perf_counter()
    run("big", trials)
    return small, time.perf_counter() - start


def _optuna(trials: int, warmup: int, storage: str | None) -> tuple[float, float]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def run(name: str, n: int) -> None:
        study = optuna.create_study(
            direction="maximize",
            storage=storage,
            study_name=name,
            sampler=optuna.samplers.TPESampler(seed=0),
        )
        study.optimize(_instant_objective, n_trials=n)

    return _timed(run, trials, warmup)


def _search(trials: int, warmup: int, cpus: int, tmp: Path) -> tuple[float, float]:
    from search.specs.schema import parse_spec
    from search.tuning.runner import RunOptions, init_ray, run_study

    init_ray(None, num_cpus=cpus)

    def spec(name: str, n: int) -> Any:
        return parse_spec(
            {
                "study": name,
                "trainable": "search.testing:instant",
                "objective": {"metric": "val_accuracy", "mode": "max"},
                "budget": {"trials": n, "max_epochs": 1},
                "sampler": {"name": "tpe", "seed": 0},
                "storage": f"sqlite:///{tmp}/optuna.db",
                "space": {"x": {"uniform": [0.0, 1.0]}},
            }
        )

    options = RunOptions(results_dir=tmp / "results", progress=False)
    return _timed(lambda name, n: run_study(spec(name, n), options), trials, warmup)


def _tune_trainable(config: dict[str, Any]) -> None:
    from ray import tune

    from search.contract import TrialContext
    from search.testing import instant

    for metrics in instant(config, None, TrialContext(max_epochs=1)):
        tune.report(metrics)


def _ray(trials: int, warmup: int, cpus: int, tmp: Path, stock: bool) -> tuple[float, float]:
    if not stock:
        os.environ.update(
            {
                "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
                "RAY_CHDIR_TO_TRIAL_DIR": "0",
                "RAY_AIR_NEW_OUTPUT": "0",
            }
        )
    import ray
    from ray import tune

    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)

    def tuner(name: str, n: int) -> Any:
        if stock:
            from ray.tune.schedulers import ASHAScheduler
            from ray.tune.search.optuna import OptunaSearch

            config = tune.TuneConfig(
                search_alg=OptunaSearch(),
                scheduler=ASHAScheduler(),
                num_samples=n,
                metric="val_accuracy",
                mode="max",
            )
        else:
            config = tune.TuneConfig(
                num_samples=n,
                metric="val_accuracy",
                mode="max",
                reuse_actors=True,
                max_concurrent_trials=cpus,
            )
        return tune.Tuner(
            _tune_trainable,
            param_space={"x": tune.uniform(0.0, 1.0)},
            tune_config=config,
            run_config=tune.RunConfig(
                name=name, storage_path=str(tmp / "ray"), verbose=None if stock else 0
            ),
        )

    return _timed(lambda name, n: tuner(name, n).fit(), trials, warmup)


def run_contender(name: str, trials: int, warmup: int, cpus: int) -> tuple[float, float]:
    """Seconds the timed runs of ``warmup`` and of ``trials`` trials took (warm)."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as folder:
        tmp = Path(folder)
        if name == "search":
            return _search(trials, warmup, cpus, tmp)
        if name in ("ray-stock", "ray-floor"):
            return _ray(trials, warmup, cpus, tmp, stock=name == "ray-stock")
        if name == "optuna-mem":
            return _optuna(trials, warmup, None)
        if name == "optuna-sqlite":
            return _optuna(trials, warmup, f"sqlite:///{tmp}/optuna.db")
    raise ValueError(name)


# ---- the driver -------------------------------------------------------------------------------


def _measure(name: str, trials: int, warmup: int, cpus: int) -> tuple[float, float]:
    cmd = [
        sys.executable,
        __file__,
        "--contender",
        name,
        "--trials",
        str(trials),
        "--warmup",
        str(warmup),
        "--cpus",
        str(cpus),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    found = json.loads(lines[-1][len("RESULT ") :])
    return float(found["small"]), float(found["big"])


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    names = [LABELS[r["contender"]] for r in rows]
    values = [r["ms_per_trial"] for r in rows]
    bars = ax.barh(
        names,
        values,
        color=["tab:green" if r["contender"] == "search" else "tab:gray" for r in rows],
    )
    ax.set_xscale("log")
    ax.set_xlim(right=max(values) * 6)  # room for the labels
    ax.set_xlabel("orchestration per trial (ms, log scale; lower is better)")
    ax.bar_label(bars, labels=[f"{v:.0f} ms" for v in values], padding=3)
    ax.invert_yaxis()
    ax.set_title("Marginal orchestration per trial, trivial trainable, warm")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--only", nargs="*", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument(
        "--stock-trials",
        type=int,
        default=30,
        help="trials for ray-stock (default: --trials; it is the slow one)",
    )
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contender:  # the subprocess
        small, big = run_contender(args.contender, args.trials, args.warmup, args.cpus)
        print("RESULT " + json.dumps({"small": small, "big": big}), flush=True)
        return

    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in args.only}
    counts = {
        name: (args.stock_trials or args.trials) if name == "ray-stock" else args.trials
        for name in args.only
    }
    for repeat in range(args.repeats):  # interleaved, so a busy moment hits all alike
        for name in args.only:
            small, big = _measure(name, counts[name], args.warmup, args.cpus)
            runs[name].append((small, big))
            print(
                f"  [{repeat + 1}/{args.repeats}] {name:<14} {args.warmup} trials "
                f"{small:7.2f} s, {counts[name]} trials {big:7.2f} s",
                file=sys.stderr,
                flush=True,
            )

    def stats(name: str) -> tuple[float, float, float]:
        n, m = counts[name], args.warmup
        marginal = statistics.median((big - small) / (n - m) for small, big in runs[name])
        fixed = statistics.median(max(0.0, small - m * marginal) for small, _ in runs[name])
        whole = statistics.median(big / n for _, big in runs[name])
        return marginal, fixed, whole

    ours = stats("search")[0] if "search" in runs else None
    rows = []
    for name in args.only:
        marginal, fixed, whole = stats(name)
        rows.append(
            {
                "contender": name,
                "trials": counts[name],
                "repeats": args.repeats,
                "cpus": args.cpus,
                "ms_per_trial": round(marginal * 1000, 2),
                "trials_per_s": round(1.0 / marginal, 2) if marginal > 0 else "",
                "fixed_s_per_run": round(fixed, 2),
                "run_ms_per_trial": round(whole * 1000, 2),
                "x_of_search": round(marginal / ours, 2) if ours else "",
            }
        )
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "overhead.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    _plot(rows, OUT / "overhead.png")

    print(
        f"\norchestration per trial, trivial trainable, warm, {args.cpus} CPUs, "
        f"median of {args.repeats}"
    )
    print(
        f"{'contender':<48} {'trials':>6} {'ms/trial':>9} {'trials/s':>9} {'fixed s':>8} "
        f"{'run ms/tr':>9} {'x ours':>7}"
    )
    for row in rows:
        print(
            f"{LABELS[row['contender']]:<48} {row['trials']:>6} {row['ms_per_trial']:>9.1f} "
            f"{row['trials_per_s']!s:>9} {row['fixed_s_per_run']:>8.2f} "
            f"{row['run_ms_per_trial']:>9.1f} {row['x_of_search']!s:>7}"
        )
    print(f"\nwrote {OUT / 'overhead.csv'} and {OUT / 'overhead.png'}")


if __name__ == "__main__":
    main()
