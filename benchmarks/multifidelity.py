"""Multi-fidelity quality (issues 22 and 33): does early stopping reach the same regret for less,
and does it hold when many trials run at once?

Each study runs through the real command line, ``python -m search run SPEC --address ADDR``,
one cold subprocess per (task, scheduler, seed), all joining one local Ray head with logical
CPUs that this script starts (``ray start --head``, token auth, 127.0.0.1 only) and stops.

Schedulers: ``none`` (``asha: {enabled: false}``), ``asha`` (the task's own ``asha`` block:
grace 1, factor 3), ``hyperband`` (the same with ``brackets: 3``) and ``asha-recheck`` (the
same with ``recheck: true``). The no-pruning study
runs ``--trials`` trials; the pruning ones ``--more`` times as many, so they can spend the same
compute on more configs. Tasks:

    hartmann   the multi-fidelity Hartmann 6 function (``benchmarks/mfhartmann.py``), epochs as
               the fidelity, ``--preset`` bias and noise, sleeping its cost model; compute in
               epochs and simulated seconds, regret its true noise-free full-fidelity regret
    cnn150     the digits CNN (``torch_cnn``, ``spaces/cnn.yaml``) on 150 training digits
               (``train_fraction`` 150 / 1437); compute in epochs and measured training
               seconds, regret the best val_accuracy any run reached minus the study's best
    overfit    the same on ``spaces/overfit.yaml`` (43 digits, a wide CNN, grace 10, factor 2)

Every study samples with ``--sampler`` (default ``auto``, the project's default, planned for
the study's ``max_concurrent``) and runs ``--concurrency`` trials at once; several values run
the same studies at each (the head gets as many logical CPUs as the largest).

Then (``benchmarks/multifidelity_report.py``): the compute each scheduler spent to reach the
no-pruning study's final regret, per seed, and the median over seeds, against the no-pruning
study's total (the target: at most 1/3); and across concurrencies, each scheduler's final
regret and its regret at the compute every concurrency spent (issue 33: 16 at once no worse
than 4 at once). Writes under results/benchmarks/multifidelity/: ``<name>.db`` (the studies),
``<name>_runs.csv``, ``<name>_trials.csv``, ``<name>.png`` and ``<name>.md`` (the table),
where the name is the task (``hartmann-<preset>`` for Hartmann) and ``-k<K>`` (with
``-<sampler>`` for another than ``auto``), and ``<task>-concurrency.md`` across them.

    python benchmarks/multifidelity.py hartmann --preset good --concurrency 1 4 16  # and mfh6
    python benchmarks/multifidelity.py cnn150 --trials 16 --epochs 9 --more 3 --concurrency 1 4 16
    python benchmarks/multifidelity.py hartmann --concurrency 1 4 16 --report-only
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: benchmarks.* and search.* from this tree
    sys.path.insert(0, str(REPO))

from benchmarks import mfhartmann  # noqa: E402
from benchmarks import multifidelity_report as report  # noqa: E402

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

OUT = REPO / "results" / "benchmarks" / "multifidelity"
SCHEDULERS: dict[str, dict[str, Any]] = {
    "none": {"enabled": False},
    "asha": {},
    "hyperband": {"brackets": 3},
    "asha-recheck": {"recheck": True},
}
DEFAULTS = {"hartmann": (32, 27, 4), "cnn150": (16, 9, 2), "overfit": (16, 40, 2)}
"""Per task: no-pruning trials, max_epochs, trials at once."""
DIGITS_TRAIN = 1437
"""Training digits after the default 20 % validation split (360 validation digits)."""


def hartmann_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The Hartmann task's spec, before the scheduler, seed and trials are set."""
    return {
        "trainable": "benchmarks.mfhartmann:train",
        "objective": {"metric": "value", "mode": "min"},
        "budget": {"max_epochs": args.epochs},
        "asha": {"grace_period": 1, "reduction_factor": 3},
        "resources": {"cpus_per_trial": 1, "max_concurrent": args.concurrency},
        "faults": {"max_failures": 0},
        "fixed": {"preset": args.preset, "seconds_per_trial": args.seconds_per_trial},
        "space": {name: {"uniform": [0.0, 1.0]} for name in mfhartmann.PARAMS},
    }


def cnn_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The CNN tasks' spec: the shipped space, with 150 training digits for ``cnn150``."""
    space = "overfit.yaml" if args.task == "overfit" else "cnn.yaml"
    spec = yaml.safe_load((REPO / "spaces" / space).read_text())
    spec["budget"] = {"max_epochs": args.epochs}
    spec["resources"] = {"cpus_per_trial": 1, "max_concurrent": args.concurrency}
    spec["faults"] = {"max_failures": 0}
    if args.task == "cnn150":
        spec["fixed"]["train_fraction"] = round(args.n_train / DIGITS_TRAIN, 4)
    return spec


def study_spec(args: argparse.Namespace, scheduler: str, seed: int) -> dict[str, Any]:
    """The full spec of one study."""
    spec = hartmann_spec(args) if args.task == "hartmann" else cnn_spec(args)
    trials = args.trials if scheduler == report.REFERENCE else args.trials * args.more
    spec["study"] = f"{args.name}-{scheduler}-s{seed}"
    spec["budget"]["trials"] = trials
    spec["asha"] = {**spec.get("asha", {}), **SCHEDULERS[scheduler]}
    spec["sampler"] = {"name": args.sampler, "seed": seed}
    spec["storage"] = storage(args)
    return spec


def storage(args: argparse.Namespace) -> str:
    return f"sqlite:///{OUT / f'{args.name}.db'}"


def run_study(spec: dict[str, Any], address: str, env: dict[str, str]) -> float:
    """Runs one study through the command line in a fresh process; returns its wall time."""
    folder = OUT / "runs" / spec["study"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    cmd = [sys.executable, "-m", "search", "run", str(path), "--address", address]
    cmd += ["--results", str(folder / "results"), "--restart"]
    start = time.monotonic()
    with (folder / "log.txt").open("w") as log:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{spec['study']}: exit {proc.returncode}, see {folder / 'log.txt'}")
    print(f"  {spec['study']}: {wall:.1f} s (exit {proc.returncode})", flush=True)
    return wall


def run_all(args: argparse.Namespace) -> None:
    """Every (concurrency, seed, scheduler) study, concurrency by concurrency and seed by
    seed, on one shared local Ray head."""
    from benchmarks.scale_head import Head, driver_env

    with Head(num_cpus=max(args.concurrencies)) as head:
        env = driver_env()
        for one in at_each(args):
            walls = _load_walls(one)
            for seed in one.seeds:
                for scheduler in one.schedulers:
                    spec = study_spec(one, scheduler, seed)
                    walls[spec["study"]] = run_study(spec, head.address, env)
                    _walls_file(one).write_text(json.dumps(walls, indent=1))


def at_each(args: argparse.Namespace) -> list[argparse.Namespace]:
    """The arguments at each of ``--concurrency``, each with its name (module text)."""
    base = f"hartmann-{args.preset}" if args.task == "hartmann" else args.task
    sampler = "" if args.sampler == "auto" else f"-{args.sampler}"
    return [
        argparse.Namespace(**{**vars(args), "concurrency": k, "name": f"{base}-k{k}{sampler}"})
        for k in args.concurrencies
    ]


def _walls_file(args: argparse.Namespace) -> Path:
    return OUT / f"{args.name}_walls.json"


def _load_walls(args: argparse.Namespace) -> dict[str, float]:
    path = _walls_file(args)
    return json.loads(path.read_text()) if path.exists() else {}


def _score_and_seconds(args: argparse.Namespace) -> tuple[report.ScoreFn, report.SecondsFn]:
    """How a COMPLETE trial scores (lower is better) and what a trial's compute cost:
    Hartmann's true regret and simulated seconds, the CNN's minus its final val_accuracy and
    its measured training seconds."""
    if args.task == "hartmann":

        def regret(trial: FrozenTrial) -> float:
            return mfhartmann.regret([trial.params[name] for name in mfhartmann.PARAMS])

        def simulated(trial: FrozenTrial, epochs: int) -> float:
            return args.seconds_per_trial * mfhartmann.trial_cost(epochs, args.epochs)

        return regret, simulated

    def minus_accuracy(trial: FrozenTrial) -> float:
        return -float(trial.values[0])

    def measured(trial: FrozenTrial, epochs: int) -> float:
        return float(trial.user_attrs.get("seconds", 0.0))

    return minus_accuracy, measured


def summarize(args: argparse.Namespace) -> str:
    """Reads every study of the task back; writes the CSVs, the PNG and the table."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    walls = _load_walls(args)
    studies = read_studies(args)
    trial_rows = [
        {"scheduler": scheduler, "seed": seed, **vars(s)}
        for (scheduler, seed), steps in studies.items()
        for s in steps
    ]
    offset = _offset(args, [studies])
    walls_by_key = {k: walls.get(f"{args.name}-{k[0]}-s{k[1]}", math.nan) for k in studies}
    rows = report.rows_for(args.name, studies, walls_by_key, offset)
    report.write_csv(OUT / f"{args.name}_runs.csv", rows)
    _write_dicts(OUT / f"{args.name}_trials.csv", trial_rows)
    if studies:
        report.plot(OUT / f"{args.name}.png", _title(args), studies, offset)
    unit = "sim s" if args.task == "hartmann" else "train s"
    text = f"### {_title(args)}\n\n{report.table(rows, unit)}\n\n{_correlations(args)}\n"
    (OUT / f"{args.name}.md").write_text(text)
    return text


def read_studies(args: argparse.Namespace) -> dict[tuple[str, int], list[report.Step]]:
    """The steps of every study of ``args.name`` that ran, by (scheduler, seed)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    score, seconds = _score_and_seconds(args)
    studies: dict[tuple[str, int], list[report.Step]] = {}
    for seed in args.seeds:
        for scheduler in args.schedulers:
            name = f"{args.name}-{scheduler}-s{seed}"
            try:
                studies[(scheduler, seed)] = report.read_steps(storage(args), name, score, seconds)
            except KeyError:  # this study was not run
                continue
    return studies


Studies = dict[tuple[str, int], list[report.Step]]
"""A task's studies at one concurrency: their steps by (scheduler, seed)."""


def _offset(args: argparse.Namespace, groups: list[Studies]) -> float:
    """What makes scores regrets: 0 for Hartmann (its scores are regrets), for the CNN minus
    the best val_accuracy any run of ``groups`` reached."""
    if args.task == "hartmann":
        return 0.0
    return min((s.best for g in groups for steps in g.values() for s in steps), default=0.0)


def across(args: argparse.Namespace) -> str:
    """Each scheduler at each concurrency (``-concurrency.md``): final regret, and regret at
    the compute (epochs) that every concurrency's study of the seed spent."""
    per_k = {one.concurrency: read_studies(one) for one in at_each(args)}
    offset = _offset(args, list(per_k.values()))
    text = report.across_table(per_k, offset)
    base = at_each(args)[0].name.split("-k")[0]
    title = _title(args).split(", ")[:2]
    text = f"### {', '.join(title)}: concurrency {args.concurrencies}\n\n{text}\n"
    (OUT / f"{base}-concurrency.md").write_text(text)
    return text


def _correlations(args: argparse.Namespace) -> str:
    """How well each rung's value predicts the final one in the no-pruning studies."""
    from search.specs.derive import asha_milestones

    asha = study_spec(args, "asha", 0)["asha"]
    milestones = asha_milestones(asha["grace_period"], asha["reduction_factor"], args.epochs)
    rungs = [e for e in milestones if e < args.epochs]
    per_epoch: dict[int, list[float]] = {e: [] for e in rungs}
    for seed in args.seeds:
        try:
            found = report.rung_correlation(storage(args), f"{args.name}-none-s{seed}", rungs)
        except KeyError:
            continue
        for epoch, rho in found.items():
            per_epoch[epoch].append(rho)
    cells = [
        f"epoch {e}: {statistics.median(v):.2f} (n={len(v)})" for e, v in per_epoch.items() if v
    ]
    head = "Rank correlation (Spearman) of the value at a rung with the final value, no-pruning"
    return f"{head} studies, median over seeds: {', '.join(cells)}"


def _title(args: argparse.Namespace) -> str:
    if args.task == "hartmann":
        return f"MF-Hartmann 6 ({args.preset}), {args.epochs} epochs, {args.concurrency} at once"
    return f"digits CNN ({args.task}), {args.epochs} epochs, {args.concurrency} at once"


def _write_dicts(path: Path, rows: list[dict[str, Any]]) -> None:
    import csv

    if rows:
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def main() -> None:
    # a plain ``kill`` stops the run in progress and the Ray head too (``finally`` blocks)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("task", choices=("hartmann", "cnn150", "overfit"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--schedulers", nargs="+", choices=list(SCHEDULERS), default=None)
    parser.add_argument("--trials", type=int, default=None, help="no-pruning trials")
    parser.add_argument("--more", type=int, default=4, help="pruning studies: trials x this")
    parser.add_argument("--epochs", type=int, default=None, help="max_epochs")
    parser.add_argument("--concurrency", type=int, nargs="+", default=None, help="trials at once")
    parser.add_argument("--sampler", choices=("auto", "tpe", "random"), default="auto")
    parser.add_argument("--preset", choices=sorted(mfhartmann.PRESETS), default="good")
    parser.add_argument("--seconds-per-trial", type=float, default=2.0, help="Hartmann cost")
    parser.add_argument("--n-train", type=int, default=150, help="cnn150: training digits")
    parser.add_argument("--report-only", action="store_true", help="read the studies back")
    args = parser.parse_args()
    trials, epochs, concurrency = DEFAULTS[args.task]
    args.schedulers = args.schedulers or list(SCHEDULERS)
    args.trials = args.trials or trials
    args.epochs = args.epochs or epochs
    args.concurrencies = args.concurrency or [concurrency]
    OUT.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        run_all(args)
    for one in at_each(args):
        print(summarize(one))
    if len(args.concurrencies) > 1:
        print(across(args))


if __name__ == "__main__":
    main()
