"""The contenders of ``benchmarks/quality.py``, each one run of one seed on one table:

    ours         this project, cold from the command line: ``python -m search run SPEC
                 --address HEAD`` on a spec generated here (``--sampler auto|tpe|random``,
                 extra ``sampler:`` keys passed through), K trials at once
    stock        stock Ray Tune: ``OptunaSearch(sampler=TPESampler(seed))`` in a
                 ``ConcurrencyLimiter(K)``, a plain function trainable calling ``tune.report``,
                 in its own driver process joined to the same head (actors reused, as the
                 scale benchmark does: a new Python process per trial only costs time here)
    optuna-jobs  Optuna in one process, ``study.optimize(n_jobs=K)`` with ``TPESampler(seed)``:
                 K threads, each trial sleeping its recorded time
    optuna-tpe   Optuna's TPE in one process, one trial after another (TPE's sample-efficiency
                 ceiling: every trial sees every earlier result)
    random       Optuna's RandomSampler in one process

Every one searches the table's space as ``Job.space`` writes it (one of
:data:`benchmarks.tables.SPACES`), evaluates a config the same way
(:func:`benchmarks.tables.evaluate`: the recorded seed drawn by ``seed + trial number``, the
recorded time times ``scale`` slept) and returns its trials as :class:`Trial` records in the
order they were created, their parameters in the ``index`` space's terms.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.tables import Table, evaluate, load, space

REPO = Path(__file__).resolve().parents[1]
CONTENDERS = ("ours", "stock", "optuna-jobs", "optuna-tpe", "random")
SEQUENTIAL = ("optuna-tpe", "random")
"""Contenders that run one trial at a time, whatever the slice's concurrency."""
ON_RAY = ("ours", "stock")
"""Contenders that run on the slice's Ray head."""


@dataclass(frozen=True)
class Job:
    """One run: ``trials`` trials of one table with ``seed``, ``concurrency`` at once."""

    task: str
    seed: int
    trials: int
    concurrency: int
    scale: float
    folder: str
    address: str = ""
    sampler: str = "auto"
    sampler_args: dict[str, Any] = field(default_factory=dict)
    space: str = "index"


@dataclass(frozen=True)
class Trial:
    """A finished trial: its parameters (as the spec names them), the metric it reported,
    and when it started and ended (seconds since the epoch)."""

    number: int
    params: dict[str, Any]
    value: float
    start: float
    end: float


def _records(trials: list[Any], table: Table, kind: str) -> list[Trial]:
    """Optuna's finished trials as :class:`Trial` records, in order of creation, their
    parameters (written in a ``kind`` space) as the ``index`` space writes them."""
    out = []
    for t in sorted(trials, key=lambda t: t.number):
        if t.value is None or t.datetime_complete is None:
            continue
        start, end = t.datetime_start.timestamp(), t.datetime_complete.timestamp()
        params = table.params(table.row(t.params, kind))
        out.append(Trial(t.number, params, float(t.value), start, end))
    return out


def spec_for(job: Job, table: Table) -> dict[str, Any]:
    """This project's spec for ``job``: one epoch, no ASHA, the table's space."""
    bench = job.task.split("/")[0]
    return {
        "study": f"q-{job.task.replace('/', '-')}-{job.concurrency}-{job.seed}",
        "trainable": f"benchmarks.tables:{bench}",
        "data": {"loader": "benchmarks.tables:load", "args": {"task": job.task}},
        "objective": {"metric": table.metric, "mode": table.mode},
        "budget": {"trials": job.trials, "max_epochs": 1},
        "asha": {"enabled": False},
        "sampler": {"name": job.sampler, "seed": job.seed, **job.sampler_args},
        "resources": {"cpus_per_trial": 1, "max_concurrent": job.concurrency},
        "fixed": {"scale": job.scale, "space": job.space},
        "space": space(table, job.space),
    }


def run_ours(job: Job, table: Table, env: dict[str, str]) -> list[Trial]:
    """``python -m search run`` on a generated spec, as a user runs it; the study read back."""
    import optuna

    folder = Path(job.folder)
    folder.mkdir(parents=True, exist_ok=True)
    spec = spec_for(job, table)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    storage = f"sqlite:///{folder}/optuna.db"
    cmd = [sys.executable, "-m", "search", "run", str(path), "--results", str(folder / "r")]
    cmd += ["--storage", storage]
    if job.address:
        cmd += ["--address", job.address]
    with (folder / "run.log").open("w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    if done.returncode != 0:
        tail = (folder / "run.log").read_text()[-3000:]
        raise RuntimeError(f"search run failed ({done.returncode}): {tail}")
    study = optuna.load_study(study_name=spec["study"], storage=storage)
    return _records(study.get_trials(deepcopy=False), table, job.space)


def distributions(table: Table, kind: str = "index") -> dict[str, Any]:
    """The table's space as Optuna distributions, as :func:`benchmarks.tables.space` writes
    a ``kind`` space."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    return {
        name: CategoricalDistribution(p["choice"]) if "choice" in p else IntDistribution(*p["int"])
        for name, p in space(table, kind).items()
    }


def run_sequential(job: Job, table: Table, name: str) -> list[Trial]:
    """Optuna in one process, one trial at a time: TPE (Optuna's defaults) or random."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = (
        optuna.samplers.TPESampler(seed=job.seed)
        if name == "optuna-tpe"
        else optuna.samplers.RandomSampler(seed=job.seed)
    )
    direction = "maximize" if table.mode == "max" else "minimize"
    study = optuna.create_study(sampler=sampler, direction=direction)
    space_ = distributions(table, job.space)
    for _ in range(job.trials):
        trial = study.ask(space_)
        value = evaluate(table, trial.params, job.seed + trial.number, job.scale, job.space)
        study.tell(trial, value)
    return _records(study.get_trials(deepcopy=False), table, job.space)


def run_optuna_jobs(job: Job, table: Table) -> list[Trial]:
    """Optuna in one process, ``study.optimize(n_jobs=K)``: K threads, TPE (Optuna's
    defaults), each trial sleeping its recorded time times ``scale``."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    direction = "maximize" if table.mode == "max" else "minimize"
    sampler = optuna.samplers.TPESampler(seed=job.seed)
    study = optuna.create_study(sampler=sampler, direction=direction)
    space_ = space(table, job.space)

    def objective(trial: optuna.Trial) -> float:  # as a user writes it
        params = {
            name: trial.suggest_categorical(name, p["choice"])
            if "choice" in p
            else trial.suggest_int(name, *p["int"])
            for name, p in space_.items()
        }
        return evaluate(table, params, job.seed + trial.number, job.scale, job.space)

    study.optimize(objective, n_trials=job.trials, n_jobs=job.concurrency)
    return _records(study.get_trials(deepcopy=False), table, job.space)


def _tune_trial(config: dict[str, Any], table: Table, seed: int, scale: float, kind: str) -> None:
    """Stock Tune's trainable: the same look-up and sleep, reported with ``tune.report``."""
    from ray import tune

    context = tune.get_context()  # its folder: <name>_<tag>_<config>, tag 1 for the first
    tag = Path(context.get_trial_dir()).name[len(context.get_trial_name()) + 1 :]
    number = int(tag.split("_", 1)[0]) - 1  # the Optuna trial number: one ask per trial
    tune.report({table.metric: evaluate(table, config, seed + number, scale, kind)})


def run_stock(job: Job) -> list[Trial]:
    """Stock Ray Tune in this process, joined to the head at ``job.address``."""
    import optuna
    import ray
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    table = load(job.task)
    ray.init(address=job.address, log_to_driver=False)
    searcher = OptunaSearch(
        space=distributions(table, job.space),
        metric=table.metric,
        mode=table.mode,
        sampler=optuna.samplers.TPESampler(seed=job.seed),
    )
    tuner = tune.Tuner(
        tune.with_parameters(
            _tune_trial, table=table, seed=job.seed, scale=job.scale, kind=job.space
        ),
        tune_config=tune.TuneConfig(
            search_alg=ConcurrencyLimiter(searcher, max_concurrent=job.concurrency),
            num_samples=job.trials,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(name="stock", storage_path=f"{job.folder}/ray", verbose=0),
    )
    tuner.fit()
    return _records(searcher._ot_study.get_trials(deepcopy=False), table, job.space)


def stock_subprocess(job: Job, env: dict[str, str]) -> list[Trial]:
    """:func:`run_stock` in its own driver process (``quality.py stock JOB``)."""
    Path(job.folder).mkdir(parents=True, exist_ok=True)
    out = Path(job.folder) / "stock.json"
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "quality.py"),
        "stock",
        json.dumps(asdict(job)),
    ]
    cmd += ["--out", str(out)]
    with (Path(job.folder) / "stock.log").open("w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    if done.returncode != 0:
        tail = (Path(job.folder) / "stock.log").read_text()[-3000:]
        raise RuntimeError(f"stock Ray Tune failed ({done.returncode}): {tail}")
    return [Trial(**t) for t in json.loads(out.read_text())]
