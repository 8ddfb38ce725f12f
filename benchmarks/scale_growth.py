"""Growth: what one more trial costs the driver as the study grows, and reading a big study.

The study (the space of ``spaces/cnn.yaml``, TPE as ``run`` builds it) is filled with finished
trials written by Optuna directly (``Study.add_trials``: random configs, each PRUNED at epoch 1
or 3 or COMPLETE at 5 with its curve and user attributes), so 10,000 trials take a minute, not
hours. At each size the real driver path asks and tells ``--probe`` trials: the bridge's
``suggest`` (create the trial, TPE samples it) and its end (five results, ``on_trial_complete``:
the fate, the user attributes, ``tell``), through the write-behind storage. Then ``python -m
search trials`` and ``report`` run on the largest study.
"""

from __future__ import annotations

import argparse
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.scale_head import REPO, driver_env

EPOCHS = 5


def _spec(storage: str) -> Any:
    from search.specs.schema import load_spec, with_overrides

    return with_overrides(
        load_spec(REPO / "spaces" / "cnn.yaml"),
        **{"study": "growth", "storage": storage, "budget.max_epochs": EPOCHS},
    )


def _fake_trials(spec: Any, count: int, rng: random.Random) -> list[Any]:
    """``count`` finished trials with random configs of the spec's space, and curves."""
    import optuna

    from search.specs.space import sample

    scratch = optuna.create_study(sampler=optuna.samplers.RandomSampler(rng.randrange(2**31)))
    out = []
    for _ in range(count):
        trial = scratch.ask()
        sample(trial, spec.space)
        epochs = rng.choice((1, 1, 1, 1, 1, 1, 3, 3, EPOCHS))
        top = rng.random()
        curve = {e: top * (1 - 0.5**e) for e in range(1, epochs + 1)}
        state = "COMPLETE" if epochs == EPOCHS else "PRUNED"
        out.append(
            optuna.trial.create_trial(
                state=optuna.trial.TrialState[state],
                value=curve[epochs],
                params=trial.params,
                distributions=trial.distributions,
                intermediate_values=curve,
                user_attrs={"epochs": epochs, "seconds": 0.2 * epochs, "retries": 0},
            )
        )
    return out


def _probe(bridge: Any, size: int, count: int) -> tuple[list[float], list[float]]:
    """Asks and tells ``count`` trials through the bridge; their ask and tell seconds."""
    from search.tuning.fate import EPOCH, METRIC_KEYS

    asks, tells = [], []
    for i in range(count):
        trial_id = f"growth-{size}-{i}"
        start = time.perf_counter()
        bridge.suggest(trial_id)
        asks.append(time.perf_counter() - start)
        for epoch in range(1, EPOCHS + 1):
            result = {"val_accuracy": 0.5, EPOCH: epoch, METRIC_KEYS: ["val_accuracy"]}
            if epoch < EPOCHS:
                bridge.on_trial_result(trial_id, result)
        start = time.perf_counter()
        bridge.on_trial_complete(trial_id, {**result, "done": True})
        tells.append(time.perf_counter() - start)
    return asks, tells


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _bridge(spec: Any) -> tuple[Any, Any]:
    import optuna

    from search.record.study import open_study, record_spec
    from search.record.writeback import WriteBehindStorage
    from search.tuning.bridge import OptunaBridge

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(spec, restart=True)
    record_spec(study, spec)
    storage = WriteBehindStorage(study._storage)
    driven = optuna.Study(study_name=spec.study, storage=storage, sampler=study.sampler)
    bridge = OptunaBridge(
        driven, spec.space, spec.fixed, metric="val_accuracy", mode="max", max_epochs=EPOCHS
    )
    return study, bridge


def _cli(command: str, storage: str, results: str) -> float:
    args = [sys.executable, "-m", "search", command, "growth", "--storage", storage]
    if command == "report":
        args += ["--results", results]
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=driver_env())
    if done.returncode != 0:
        raise SystemExit(f"{command} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - start


def _ms(values: list[float]) -> str:
    return f"{_pct(values, 0.5) * 1e3:.0f}/{_pct(values, 0.95) * 1e3:.0f}"


def _grow(study: Any, bridge: Any, spec: Any, args: argparse.Namespace) -> int:
    """Fills the study size by size, probing ask and tell at each; returns its trials."""
    rng, have = random.Random(0), 0
    print(
        f"{'trials':>7} {'fill s':>7} {'read s':>7} {'ask p50/p95 ms':>15} "
        f"{'tell p50/p95 ms':>16} {'RSS MB':>7}"
    )
    for size in sorted(args.sizes):
        start = time.perf_counter()
        study.add_trials(_fake_trials(spec, max(0, size - have - args.probe), rng))
        fill = time.perf_counter() - start
        # The driver reads the trials it has not seen once (a resumed run at its start, a
        # running one as they finish): that read is timed apart, not as an ask.
        start = time.perf_counter()
        bridge.study._storage.get_all_trials(bridge.study._study_id, deepcopy=False)
        first = time.perf_counter() - start
        asks, tells = _probe(bridge, size, args.probe)
        have = len(study.get_trials(deepcopy=False))
        print(
            f"{have:>7} {fill:>7.1f} {first:>7.1f} {_ms(asks):>15} {_ms(tells):>16} "
            f"{_rss_mb():>7.0f}"
        )
    return have


def main(args: argparse.Namespace) -> None:
    """The growth mode of ``benchmarks/scale.py``."""
    with tempfile.TemporaryDirectory(prefix="scale-growth-") as folder:
        storage = args.postgres or f"sqlite:///{folder}/growth.db"
        spec = _spec(storage)
        study, bridge = _bridge(spec)
        print(f"growth on {'PostgreSQL' if args.postgres else 'SQLite'}, TPE, the cnn space")
        have = _grow(study, bridge, spec, args)
        bridge.study._storage.close()
        trials = study.get_trials(deepcopy=False)
        open_ = sum(t.state.name in ("RUNNING", "WAITING") for t in trials)
        print(f"record: {len(trials)} trials, {open_} RUNNING/WAITING")
        for command in ("trials", "report"):
            seconds = _cli(command, storage, folder)
            print(f"python -m search {command} on {have} trials: {seconds:.1f} s")
