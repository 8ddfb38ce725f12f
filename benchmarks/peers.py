"""The digits CNN space against its peers: same training code, same budget, only orchestration
differs, every contender timed cold from its command line, as a user runs it.

Every contender trains ``benchmarks.peers_cnn:train`` (the built-in CNN written as a user
trainable, logging each epoch's time and val_accuracy) on the space of ``spaces/cnn.yaml``
with ``--trials`` trials of at most ``--epochs`` epochs, once per seed. Each run is a fresh
process started by this script, with nothing warmed up for anyone: the clock starts before the
process does and stops when it exits. Seed by seed, so that a busy spell on the machine hits
every contender alike:

    search        this project, from its command line: ``python -m search run SPEC``
    optuna-sh     Optuna in one process: TPE + SuccessiveHalvingPruner (min 1, factor 3),
                  n_jobs = cores (threads)
    ray-asha      stock Ray Tune: random search (BasicVariantGenerator) + ASHA (grace 1,
                  factor 3), Tune's defaults otherwise (a new actor per trial, loggers on)
    ray-tpe       stock Ray Tune as its documentation writes it: the space as Tune domains in
                  ``param_space``, ``OptunaSearch(seed=...)`` (Optuna's default TPE), ASHA
                  (grace 1, factor 3), metric and mode in ``TuneConfig``,
                  ``reuse_actors=True``, ``tune.report`` per epoch
    random        random search without pruning: Optuna RandomSampler, no pruner,
                  n_jobs = cores

Reported per contender (median over seeds): wall time, time until the first epoch is
reported (the fixed cost of starting: processes, imports), time until some epoch reaches
``--target`` val_accuracy (``-`` if never), best val_accuracy within the budget, epochs
trained, and the phases (start-up, steady, teardown). Writes results/benchmarks/peers.csv
(one row per run), peers_summary.csv and peers.png (best val_accuracy so far against wall
time, median over seeds).

    python benchmarks/peers.py --full --seeds 0 1 2          # the default study, 32 x 27
    python benchmarks/peers.py --full --train-fraction 0.1044  # 150 training images
    python benchmarks/peers.py --trials 12 --epochs 6 --seeds 0 1 --only search optuna-sh
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: benchmarks.* and search.* from this tree
    sys.path.insert(0, str(REPO))
from benchmarks.peers_cnn import LOG_ENV, read_log  # noqa: E402

OUT = REPO / "results" / "benchmarks"
SPACE = REPO / "spaces" / "cnn.yaml"
TRAINABLE = "benchmarks.peers_cnn:train"
CONTENDERS = ("search", "optuna-sh", "ray-asha", "ray-tpe", "random")
FULL = ("search", "optuna-sh", "ray-tpe")
LABELS = {
    "search": "this project (TPE + ASHA on Ray)",
    "optuna-sh": "Optuna one process (TPE + SHA pruner)",
    "ray-asha": "Ray Tune stock (random + ASHA)",
    "ray-tpe": "Ray Tune stock (OptunaSearch TPE + ASHA, reuse)",
    "random": "random search, no pruning",
}


def _spec_data(trials: int, epochs: int, seed: int, tmp: Path, fraction: float) -> dict:
    """``spaces/cnn.yaml`` with the benchmark's budget, seed, storage and user trainable."""
    data = yaml.safe_load(SPACE.read_text())
    data.update(
        study=f"peers-{seed}",
        trainable=TRAINABLE,
        storage=f"sqlite:///{tmp}/optuna.db",
    )
    data["budget"] = {"trials": trials, "max_epochs": epochs}
    data["sampler"] = {**data.get("sampler", {}), "seed": seed}
    data["asha"] = {"grace_period": 1, "reduction_factor": 3}
    if fraction < 1.0:
        data["fixed"] = {**data.get("fixed", {}), "train_fraction": fraction}
    return data


def _spec(trials: int, epochs: int, seed: int, tmp: Path, fraction: float = 1.0) -> Any:
    from search.specs.schema import parse_spec

    return parse_spec(_spec_data(trials, epochs, seed, tmp, fraction))


def search_command(
    trials: int, epochs: int, seed: int, cpus: int, tmp: Path, fraction: float
) -> list[str]:
    """This project's contender: its command line on a spec written to ``tmp``."""
    spec = tmp / "peers.yaml"
    data = _spec_data(trials, epochs, seed, tmp, fraction)
    data["resources"] = {"cpus_per_trial": 1, "max_concurrent": cpus}
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    return [sys.executable, "-m", "search", "run", str(spec), "--results", str(tmp / "r")]


# ---- contenders (each runs in a process of its own, one seed) ----------------------------------


def _optuna(
    trials: int, epochs: int, seed: int, cpus: int, tmp: Path, fraction: float, pruned: bool
) -> None:
    import optuna

    from benchmarks.peers_cnn import train
    from search.compute.data import load_data
    from search.contract import TrialContext
    from search.specs.space import sample

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = _spec(trials, epochs, seed, tmp, fraction)
    data = load_data(spec.data)

    def objective(trial: Any) -> float:
        params = {**spec.fixed, **sample(trial, spec.space)}
        ctx = TrialContext(max_epochs=epochs, num_threads=1, seed=seed + trial.number)
        value = 0.0
        generator = train(params, data, ctx)
        try:
            for epoch, metrics in enumerate(generator, 1):
                value = float(metrics["val_accuracy"])
                trial.report(value, epoch)
                if trial.should_prune():
                    raise optuna.TrialPruned()
        finally:
            generator.close()
        return value

    if pruned:
        sampler: Any = optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True, constant_liar=True
        )
        pruner: Any = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    else:
        sampler, pruner = optuna.samplers.RandomSampler(seed=seed), optuna.pruners.NopPruner()
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    study.optimize(objective, n_trials=trials, n_jobs=cpus)


def _tune_domains(space: dict) -> dict:
    from ray import tune

    domains = {}
    for name, param in space.items():
        kind = param.kind
        if kind == "uniform":
            domains[name] = tune.uniform(*param.uniform)
        elif kind == "loguniform":
            domains[name] = tune.loguniform(*param.loguniform)
        elif kind == "int":
            domains[name] = tune.randint(param.int_[0], param.int_[1] + 1)
        elif kind == "choice":
            domains[name] = tune.choice(param.choice)
        else:
            domains[name] = param.fixed
    return domains


def _tune_trial(
    config: dict, space: dict, fixed: dict, epochs: int, data: Any, seed: int = 0
) -> None:
    """Stock Tune's trainable: the CNN, ``tune.report`` per epoch. Its seed: the config's
    (random search), else ``seed`` plus the trial's number in Tune's trial name."""
    from ray import tune

    from benchmarks.peers_cnn import train
    from search.contract import TrialContext
    from search.specs.space import is_active, order

    params: dict = {}
    for name in order(space):  # Tune has no conditions: drop what the space would not ask
        if is_active(space[name], params):
            params[name] = config[name]
    if "seed" not in config:
        context = tune.get_context()  # its folder: <name>_<tag>_<config>, tag 1 for the first
        tag = Path(context.get_trial_dir()).name[len(context.get_trial_name()) + 1 :]
        seed += int(tag.split("_", 1)[0]) - 1
    ctx = TrialContext(max_epochs=epochs, num_threads=1, seed=int(config.get("seed", seed)))
    for metrics in train({**fixed, **params}, data, ctx):
        tune.report(metrics)


def _ray_asha(trials: int, epochs: int, seed: int, cpus: int, tmp: Path, fraction: float) -> None:
    """Stock Ray Tune with its defaults: random search (``BasicVariantGenerator``) + ASHA, a new
    actor per trial, the trial's seed a random integer of its config."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from search.compute.data import load_data

    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    spec = _spec(trials, epochs, seed, tmp, fraction)
    trainable = tune.with_parameters(
        _tune_trial, space=spec.space, fixed=spec.fixed, epochs=epochs, data=load_data(spec.data)
    )
    tune.Tuner(
        trainable,
        param_space={**_tune_domains(spec.space), "seed": tune.randint(0, 2**31 - 1)},
        tune_config=tune.TuneConfig(
            metric="val_accuracy",
            mode="max",
            num_samples=trials,
            search_alg=BasicVariantGenerator(random_state=seed),
            scheduler=ASHAScheduler(max_t=epochs, grace_period=1, reduction_factor=3),
            reuse_actors=False,
        ),
        run_config=tune.RunConfig(
            name=f"peers-{seed}-{trials}", storage_path=str(tmp / "ray"), verbose=0
        ),
    ).fit()


def _ray_tpe(trials: int, epochs: int, seed: int, cpus: int, tmp: Path, fraction: float) -> None:
    """Stock Ray Tune as its documentation writes it: the space as Tune's domains in
    ``param_space``, ``OptunaSearch(seed=...)`` (Optuna's default TPE), ``ASHAScheduler``,
    metric and mode in ``TuneConfig``, ``reuse_actors=True``, the CNN a function trainable
    with ``tune.report`` per epoch."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    from search.compute.data import load_data

    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    spec = _spec(trials, epochs, seed, tmp, fraction)
    data = load_data(spec.data)
    trainable = tune.with_parameters(
        _tune_trial, space=spec.space, fixed=spec.fixed, epochs=epochs, data=data, seed=seed
    )
    tune.Tuner(
        trainable,
        param_space=_tune_domains(spec.space),
        tune_config=tune.TuneConfig(
            metric="val_accuracy",
            mode="max",
            search_alg=OptunaSearch(seed=seed),
            scheduler=ASHAScheduler(max_t=epochs, grace_period=1, reduction_factor=3),
            num_samples=trials,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=f"peers-{seed}-{trials}", storage_path=str(tmp / "ray"), verbose=0
        ),
    ).fit()


CONTENDER_FNS: dict[str, Callable[..., None]] = {
    "optuna-sh": lambda *a: _optuna(*a, pruned=True),
    "random": lambda *a: _optuna(*a, pruned=False),
    "ray-asha": _ray_asha,
    "ray-tpe": _ray_tpe,
}


def command(
    name: str, trials: int, epochs: int, seed: int, cpus: int, tmp: Path, fraction: float
) -> list[str]:
    """The command line that runs contender ``name`` for one seed, cold."""
    if name == "search":
        return search_command(trials, epochs, seed, cpus, tmp, fraction)
    return [
        sys.executable, __file__, "--contender", name, "--trials", str(trials),
        "--epochs", str(epochs), "--cpus", str(cpus), "--seeds", str(seed),
        "--tmp", str(tmp), "--train-fraction", str(fraction),
    ]  # fmt: skip


def run_cold(
    name: str, trials: int, epochs: int, seed: int, cpus: int, fraction: float
) -> dict[str, Any]:
    """One seed of one contender in a fresh process: wall seconds from before the process
    starts to its exit, the epochs its trainable logged, and their ``(seconds, value)``."""
    with tempfile.TemporaryDirectory(prefix=f"peers-{name}-") as folder:
        tmp = Path(folder)
        log = tmp / "epochs.log"
        env = {**os.environ, "PYTHONPATH": str(REPO), LOG_ENV: str(log)}
        cmd = command(name, trials, epochs, seed, cpus, tmp, fraction)
        start = time.time()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
        wall = time.time() - start
        if done.returncode != 0:
            raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
        points = read_log(str(log), start)
    return {"wall_s": wall, "epochs": len(points), "points": points}


# ---- the driver -------------------------------------------------------------------------------


def _time_to(points: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, v in sorted(points) if v >= target), None)


def _best_so_far(points: list[tuple[float, float]], grid: list[float]) -> list[float]:
    ordered, best, i, out = sorted(points), float("nan"), 0, []
    for t in grid:
        while i < len(ordered) and ordered[i][0] <= t:
            best = ordered[i][1] if best != best else max(best, ordered[i][1])
            i += 1
        out.append(best)
    return out


def _plot(runs: dict[str, list[dict]], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    horizon = max(r["wall_s"] for rs in runs.values() for r in rs)
    grid = [horizon * i / 300 for i in range(301)]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, results in runs.items():
        curves = [_best_so_far(r["points"], grid) for r in results]
        median = []
        for column in zip(*curves, strict=True):
            known = [v for v in column if v == v]
            median.append(statistics.median(known) if len(known) * 2 > len(column) else None)
        style = {"lw": 2.5} if name == "search" else {"lw": 1.5}
        ax.plot(
            grid,
            [m if m is not None else float("nan") for m in median],
            label=LABELS[name],
            **style,
        )
    ax.axhline(target, color="gray", ls=":", lw=1)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("best val_accuracy so far (median over seeds)")
    ax.set_ylim(0.5, 1.0)
    ax.legend(loc="lower right")
    ax.set_title("Digits CNN: anytime performance, same budget, same training code")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=9)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--only", nargs="*", choices=CONTENDERS)
    parser.add_argument("--full", action="store_true", help="32 x 27, target 0.97, TPE peers")
    parser.add_argument("--fixed", action="store_true", help="fixed work: 16 x 27, 2 at once")
    parser.add_argument("--work", type=float, default=0.15, help="fixed work: s per epoch")
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--fixed-contender", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    parser.add_argument(
        "--train-fraction",
        type=float,
        default=1.0,
        help="share of training (0.1044: 150)",
    )
    args = parser.parse_args()
    if args.fixed_contender:
        _fixed_contender(args)
        return
    if args.fixed:
        _fixed(args)
        return
    if args.full:
        args.trials, args.epochs, args.target = 32, 27, 0.97
    args.only = args.only or list(FULL if args.full else CONTENDERS)
    if args.contender:  # the subprocess: one seed, cold
        CONTENDER_FNS[args.contender](
            args.trials, args.epochs, args.seeds[0], args.cpus, Path(args.tmp), args.train_fraction
        )
        return

    runs: dict[str, list[dict]] = {name: [] for name in args.only}
    for seed in args.seeds:  # seed by seed, so a busy spell on the machine hits every contender
        for name in args.only:
            runs[name].append(
                run_cold(name, args.trials, args.epochs, seed, args.cpus, args.train_fraction)
            )
            print(
                f"  seed {seed} {name:<10} {runs[name][-1]['wall_s']:6.1f} s "
                f"{runs[name][-1]['epochs']:4d} epochs",
                file=sys.stderr,
                flush=True,
            )

    OUT.mkdir(parents=True, exist_ok=True)
    per_run, summary = [], []
    for name, results in runs.items():
        for seed, r in zip(args.seeds, results, strict=True):
            per_run.append(
                {
                    "contender": name,
                    "seed": seed,
                    "wall_s": round(r["wall_s"], 1),
                    "epochs": r["epochs"],
                    "best": round(max((v for _, v in r["points"]), default=0.0), 4),
                    "first_epoch_s": _round(min((t for t, _ in r["points"]), default=None)),
                    "time_to_target_s": _round(_time_to(r["points"], args.target)),
                    "teardown_s": _round(r["wall_s"] - max((t for t, _ in r["points"]), default=0)),
                }
            )
        rows = [p for p in per_run if p["contender"] == name]
        reached = [p["time_to_target_s"] for p in rows if p["time_to_target_s"] is not None]
        summary.append(
            {
                "contender": name,
                "seeds": len(rows),
                "trials": args.trials,
                "epochs": args.epochs,
                "wall_s": round(statistics.median(p["wall_s"] for p in rows), 1),
                "epochs_trained": statistics.median(p["epochs"] for p in rows),
                "first_epoch_s": statistics.median(p["first_epoch_s"] or 0.0 for p in rows),
                "best": statistics.median(p["best"] for p in rows),
                "reached_target": f"{len(reached)}/{len(rows)}",
                "time_to_target_s": (
                    round(statistics.median(reached), 1) if len(reached) * 2 > len(rows) else None
                ),
            }
        )
    _write(OUT / "peers.csv", per_run)
    _write(OUT / "peers_summary.csv", summary)
    _plot(runs, args.target, OUT / "peers.png")

    ours = next((s for s in summary if s["contender"] == "search"), None)
    print(
        f"\ndigits CNN, {args.trials} trials x {args.epochs} epochs, train fraction "
        f"{args.train_fraction}, seeds {args.seeds}, "
        f"{args.cpus} CPUs, target val_accuracy {args.target} (medians over seeds)"
    )
    print(
        f"{'contender':<40} {'wall s':>7} {'x ours':>6} {'1st epoch s':>11} "
        f"{'to target s':>11} {'x ours':>6} {'reached':>7} {'best':>6} {'epochs':>6}"
    )
    for s in summary:
        wall_x = s["wall_s"] / ours["wall_s"] if ours else float("nan")
        tt, ott = s["time_to_target_s"], ours["time_to_target_s"] if ours else None
        tt_x = f"{tt / ott:.2f}" if tt and ott else "-"
        print(
            f"{LABELS[s['contender']]:<40} {s['wall_s']:>7.1f} {wall_x:>6.2f} "
            f"{s['first_epoch_s']:>11.1f} "
            f"{tt if tt is not None else '-':>11} {tt_x:>6} {s['reached_target']:>7} "
            f"{s['best']:>6.4f} {s['epochs_trained']:>6}"
        )
    _print_phases(per_run)
    print(f"\nwrote {OUT / 'peers.csv'}, {OUT / 'peers_summary.csv'} and {OUT / 'peers.png'}")


def _fixed_contender(args: argparse.Namespace) -> None:
    from benchmarks.peers_modes import run_fixed

    with tempfile.TemporaryDirectory(prefix="peers-fixed-") as folder:
        found = run_fixed(
            args.fixed_contender, args.trials, args.epochs, args.cpus, args.reps, Path(folder)
        )
    print("RESULT " + json.dumps(found), flush=True)


def _fixed(args: argparse.Namespace) -> None:
    """Fixed work (benchmarks/peers_modes.py): 16 x 27 by default, 2 at once, ASHA off."""
    from benchmarks.peers_modes import FIXED_CONTENDERS, print_fixed
    from benchmarks.scale_trainables import calibrate

    trials = 16 if args.trials == 16 else args.trials
    epochs = 27 if args.epochs == 9 else args.epochs
    reps = calibrate(args.work)
    rows = []
    for name in FIXED_CONTENDERS:
        cmd = [sys.executable, __file__, "--fixed-contender", name, "--trials", str(trials)]
        cmd += ["--epochs", str(epochs), "--cpus", str(args.cpus), "--reps", str(reps)]
        rows.append({"contender": name, **_result(cmd)})
        print(f"  {name:<7} {rows[-1]['wall_s']:6.1f} s", file=sys.stderr, flush=True)
    print_fixed(rows, trials * epochs * args.work / args.cpus)
    OUT.mkdir(parents=True, exist_ok=True)
    _write(OUT / "peers_fixed.csv", rows)


def _result(cmd: list[str]) -> Any:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{cmd[3]} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def _print_phases(per_run: list[dict]) -> None:
    """Start-up (to the first epoch), steady state and teardown (after the last), medians."""
    print(f"\n{'contender':<40} {'startup s':>9} {'steady s':>9} {'teardown s':>10}")
    for name in dict.fromkeys(p["contender"] for p in per_run):
        rows = [p for p in per_run if p["contender"] == name]
        first = statistics.median(p["first_epoch_s"] or 0.0 for p in rows)
        down = statistics.median(p["teardown_s"] or 0.0 for p in rows)
        wall = statistics.median(p["wall_s"] for p in rows)
        print(f"{LABELS[name]:<40} {first:>9.1f} {wall - first - down:>9.1f} {down:>10.1f}")


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
