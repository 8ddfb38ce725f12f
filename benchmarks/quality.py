"""Search quality on tables no one here wrote (issues 22, 33): HPOLib (4 tables), HPOBench (8).

Each trial looks its config up in a tabular benchmark (``benchmarks/tables.py``), sleeps the
recorded training time times ``--scale`` and reports the recorded metric. Contenders
(``benchmarks/quality_runs.py``), side by side in one slice (tables x one concurrency K x one
way of writing the space, ``--space index|choice``):

    ours         this project, ``python -m search run`` cold from the command line, K at once
                 (``--sampler auto|tpe|random``; ``--sampler-arg key=value`` adds ``sampler:``
                 keys)
    stock        stock Ray Tune: OptunaSearch (TPE) in a ConcurrencyLimiter(K)
    optuna-jobs  Optuna in one process, ``study.optimize(n_jobs=K)`` (threads), TPE
    optuna-tpe   Optuna's TPE in one process, sequential (the ceiling for TPE)
    random       Optuna's RandomSampler in one process

The Ray contenders join one local head (``ray start --head --num-cpus max(16, K)``, token
auth) that the slice starts and stops, or the head at ``--address``. Each slice appends one
row per trial to its own CSV under results/benchmarks/quality/; ``merge`` reads them all and
prints (and writes to REPORT.md) the regret tables of one space, with quality.png.

    python benchmarks/quality.py run --tasks hpolib --concurrency 16        # 10 seeds each
    python benchmarks/quality.py run --tasks hpolib/naval_propulsion --concurrency 4 \\
        --seeds 5 --contenders ours stock --sampler random --space choice
    python benchmarks/quality.py merge --space index
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import yaml

if __package__ in (None, ""):  # run as a script: the repository root holds ``benchmarks``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.quality_report import rows  # noqa: E402
from benchmarks.quality_runs import (  # noqa: E402
    CONTENDERS,
    ON_RAY,
    SEQUENTIAL,
    Job,
    Trial,
    run_optuna_jobs,
    run_ours,
    run_sequential,
    run_stock,
    stock_subprocess,
)
from benchmarks.scale_head import RAY_ENV, REPO, Head, driver_env  # noqa: E402
from benchmarks.tables import SPACES, TASKS, Table, load  # noqa: E402

OUT = REPO / "results" / "benchmarks" / "quality"
FIELDS = [
    *("task", "contender", "concurrency", "space", "mode", "scale", "code", "seed", "trial"),
    "number",
    *("row", "value", "regret", "norm_log_regret", "best_regret", "log_best", "norm_log_best"),
    *("cost", "sim_end_s", "wall_end_s"),
]


def _tasks(names: list[str]) -> list[str]:
    """``hpolib``, ``hpobench``, ``all`` or ``bench/dataset`` names, as tasks."""
    out: list[str] = []
    for name in names:
        found = [t for t in TASKS if name == "all" or t == name or t.startswith(f"{name}/")]
        if not found:
            raise SystemExit(f"error: --tasks: unknown task {name!r}; one of {', '.join(TASKS)}")
        out += [t for t in found if t not in out]
    return out


def _code() -> str:
    """The commit the measured code is at (``+`` when the tree has changes)."""
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "search"], capture_output=True)
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def _name(job: Job, contender: str) -> str:
    """The contender as the CSV names it: ``ours-tpe`` (with its sampler arguments)."""
    if contender != "ours":
        return contender
    extra = ",".join(f"{k}={v}" for k, v in sorted(job.sampler_args.items()))
    return f"ours-{job.sampler}" + (f"[{extra}]" if extra else "")


class Slice:
    """The CSV of one slice, appended run by run (a slice cut short keeps what it ran)."""

    def __init__(self, path: Path, scale: float) -> None:
        self.path, self.scale, self.code = path, scale, _code()
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            csv.DictWriter(f, FIELDS).writeheader()

    def add(self, table: Table, job: Job, contender: str, trials: list[Trial]) -> None:
        """Appends one run's rows."""
        k = 1 if contender in SEQUENTIAL else job.concurrency
        meta = {"task": job.task, "contender": _name(job, contender), "concurrency": k}
        meta |= {"space": job.space, "mode": table.mode, "scale": self.scale, "code": self.code}
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, FIELDS).writerows(rows(table, trials, meta, job.seed))
        print(
            f"  {job.task} {meta['contender']} x{k} {job.space} seed {job.seed}: "
            f"{len(trials)} trials",
            flush=True,
        )


def _env(address: str | None) -> dict[str, str]:
    """The drivers' environment: the benchmark's head's (token auth), or for a head of the
    user's, this environment with the repository importable."""
    if address is None:
        return driver_env()
    path = os.environ.get("PYTHONPATH", "")
    return {
        **os.environ,
        **RAY_ENV,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), path) if p),
    }


def _base(args: argparse.Namespace, address: str) -> Job:
    """The slice's job, before its task, seed and folder are set."""
    extra = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in args.sampler_arg)}
    job = Job("", 0, args.trials, args.concurrency, args.scale, "", address, args.sampler)
    return replace(job, sampler_args=extra, space=args.space)


def _sequential(tables: list[Table], args: argparse.Namespace, out: Slice) -> None:
    """The one-process contenders, every task and seed at once in threads (they mostly
    sleep; their order does not change what they find)."""
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    base = _base(args, "")
    runs = [
        (table, replace(base, task=table.task, seed=seed), who)
        for who in args.contenders
        if who in SEQUENTIAL
        for table in tables
        for seed in seeds
    ]
    if not runs:
        return
    with ThreadPoolExecutor(max_workers=min(32, len(runs))) as pool:
        found = pool.map(lambda run: run_sequential(run[1], run[0], run[2]), runs)
        for (table, job, who), trials in zip(runs, found, strict=True):
            out.add(table, job, who, trials)


def _threads(tables: list[Table], args: argparse.Namespace, out: Slice) -> None:
    """Optuna's ``n_jobs=K`` contender, one run at a time (its K threads race as in a user's
    process, not against other runs), seed by seed over every task."""
    if "optuna-jobs" not in args.contenders:
        return
    base = _base(args, "")
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for table in tables:
            job = replace(base, task=table.task, seed=seed)
            out.add(table, job, "optuna-jobs", run_optuna_jobs(job, table))


def _on_ray(tables: list[Table], args: argparse.Namespace, out: Slice, address: str) -> None:
    """The Ray contenders, seed by seed, each seed over every task (a slice cut short has
    every task for the seeds it finished), one driver process at a time."""
    env = _env(args.address)
    base = _base(args, address)
    work = Path(args.work)
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for table in tables:
            for who in [c for c in args.contenders if c in ON_RAY]:
                space = "" if args.space == "index" else f"-{args.space}"
                folder = work / table.task.replace("/", "-") / f"k{args.concurrency}{space}"
                job = replace(
                    base, task=table.task, seed=seed, folder=str(folder / f"{who}-{seed}")
                )
                trials = run_ours(job, table, env) if who == "ours" else stock_subprocess(job, env)
                out.add(table, job, who, trials)


def run(args: argparse.Namespace) -> None:
    """Runs one slice: the tasks at one concurrency and space, every contender, every seed."""
    tasks = _tasks(args.tasks)
    if args.seeds is None:
        args.seeds = 10 if args.concurrency == 16 else 5
    stamp = time.strftime("%Y%m%d-%H%M%S")
    names = "+".join(t.split("/")[-1] for t in tasks)[:60]
    name = f"{names}_k{args.concurrency}_{args.space}_{stamp}.csv"
    out = Slice(Path(args.out) / name, args.scale)
    needs_ray = any(c in ON_RAY for c in args.contenders)
    cpus = max(16, args.concurrency)  # every trial of K at once gets a logical CPU
    head = Head(num_cpus=cpus) if needs_ray and args.address is None else None
    try:
        tables = [load(task) for task in tasks]
        _sequential(tables, args, out)
        _threads(tables, args, out)
        _on_ray(tables, args, out, args.address or (head.address if head else ""))
    finally:
        if head is not None:
            head.stop()
    print(f"wrote {out.path}")


def stock(args: argparse.Namespace) -> None:
    """The stock Ray Tune driver (run by :func:`quality_runs.stock_subprocess`)."""
    trials = run_stock(Job(**json.loads(args.job)))
    Path(args.out).write_text(json.dumps([asdict(t) for t in trials]))


def merge(args: argparse.Namespace) -> None:
    """Reads every slice's CSV, prints the report of one space and writes REPORT.md (or
    REPORT-choice.md) and quality.png (quality-choice.png)."""
    from benchmarks.quality_tables import report

    text = report(Path(args.out), args.space)
    print(text)
    suffix = "" if args.space == "index" else f"-{args.space}"
    (Path(args.out) / f"REPORT{suffix}.md").write_text(text + "\n")


def main(argv: list[str] | None = None) -> None:
    """``run`` a slice, ``merge`` the slices' results (``stock`` is internal)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run", help="one slice: tasks x one concurrency")
    one.add_argument("--tasks", nargs="+", default=["hpolib/naval_propulsion"])
    one.add_argument("--concurrency", type=int, default=16)
    one.add_argument("--seeds", type=int, default=None, help="10 at 16 at once, else 5")
    one.add_argument("--space", choices=SPACES, default="index", help="how the spec writes it")
    one.add_argument("--first-seed", type=int, default=0)
    one.add_argument("--trials", type=int, default=200)
    one.add_argument("--scale", type=float, default=0.002)
    one.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    one.add_argument("--sampler", choices=("auto", "tpe", "random"), default="auto")
    one.add_argument("--sampler-arg", action="append", default=[], metavar="KEY=VALUE")
    one.add_argument("--address", default=None, help="a Ray head to join (default: start one)")
    one.add_argument("--out", default=str(OUT))
    one.add_argument("--work", default=None, help="studies and logs (default: a temp folder)")
    mrg = sub.add_parser("merge", help="the report over every slice's CSV")
    mrg.add_argument("--out", default=str(OUT))
    mrg.add_argument("--space", choices=SPACES, default="index", help="the space reported")
    stk = sub.add_parser("stock")
    stk.add_argument("job")
    stk.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        import tempfile

        args.work = args.work or tempfile.mkdtemp(prefix="quality-")
        run(args)
    else:
        {"merge": merge, "stock": stock}[args.command](args)


if __name__ == "__main__":
    main()
