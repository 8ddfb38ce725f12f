"""Fused trial arrays against one trial per process, cold from the command line (issue 44).

The same study (the digits CNN at a fixed shape: ``channels``, ``batch_size`` and the
optimizer fixed, ``lr``, ``weight_decay``, ``momentum`` and ``clip_norm`` searched, ASHA on)
runs as a user runs it, ``python -m search run SPEC``, once with ``resources.fuse: N`` and
once with ``fuse: off``, seed by seed and in turn, each a fresh process with a fresh study,
so a busy spell hits both alike. The clock starts before the process and stops at its exit.

Reported per contender (median over seeds): wall time, trials per hour, epochs trained per
second of wall time (every intermediate value in the study), the best ``val_accuracy``, and
the ratio of the fused wall time to the unfused one seed by seed. Rows go to
``results/benchmarks/fused.csv``.

    python benchmarks/fused.py --trials 16 --epochs 5 --fuse 8 --seeds 0 1 2
    python benchmarks/fused.py --step --members 1 2 4 8 16 [--device cuda]

``--step`` measures the array itself, in this process: the training images per second of
one epoch (training and validation) of K members as one fused array, after one epoch of
warm-up, against the same K trials' epochs one after another by the unfused built-in's
loop (each after its own warm-up epoch), on ``--device`` with all of this process's threads.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "results" / "benchmarks"


def spec(
    trials: int, epochs: int, seed: int, fuse: int | str | None, folder: Path, gpus: Any = None
) -> dict[str, Any]:
    """The study, with ``fuse`` trials per array (``None``: off; ``auto``: its decision), and
    ``gpus`` as ``gpus_per_trial`` where given."""
    resources: dict[str, Any] = {"cpus_per_trial": 1, "fuse": fuse if fuse else "off"}
    if gpus is not None:
        resources["gpus_per_trial"] = gpus
    return {
        "study": "fused-bench",
        "trainable": "torch_cnn",
        "data": {"name": "digits", "val_fraction": 0.2},
        "objective": {"metric": "val_accuracy", "mode": "max"},
        "budget": {"trials": trials, "max_epochs": epochs},
        "asha": {"grace_period": 1, "reduction_factor": 3},
        "sampler": {"name": "auto", "seed": seed},
        "storage": f"sqlite:///{folder}/optuna.db",
        "resources": resources,
        "fixed": {"channels": 16, "batch_size": 64, "optimizer": "sgd", "num_workers": 0},
        "space": {
            "lr": {"loguniform": [1e-3, 3e-1]},
            "momentum": {"uniform": [0.0, 0.95]},
            "weight_decay": {"loguniform": [1e-6, 1e-2]},
            "clip_norm": {"choice": [0.0, 1.0, 5.0]},
        },
    }


DECISIONS = ("fuse auto:", "gpus_per_trial auto:", "resources.fuse:")
"""The run's decision lines, kept with its row."""


def run_cold(
    trials: int,
    epochs: int,
    seed: int,
    fuse: int | str | None,
    gpus: Any = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One cold run; its wall time, what its study holds and its decision lines (``env``:
    added to this process's environment, e.g. ``RAY_ADDRESS`` or ``CUDA_VISIBLE_DEVICES``)."""
    import os

    import optuna

    with tempfile.TemporaryDirectory(prefix="fused-bench-") as tmp:
        folder = Path(tmp)
        path = folder / "spec.yaml"
        path.write_text(yaml.safe_dump(spec(trials, epochs, seed, fuse, folder, gpus)))
        command = [sys.executable, "-m", "search", "run", str(path), "--results", str(folder)]
        start = time.perf_counter()
        proc = subprocess.run(
            command, cwd=REPO, capture_output=True, text=True, timeout=3600,
            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        )  # fmt: skip
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"error: {' '.join(command)} exited {proc.returncode}:\n{proc.stderr}")
        study = optuna.load_study(study_name="fused-bench", storage=f"sqlite:///{folder}/optuna.db")
        done = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
        epochs_trained = sum(len(t.intermediate_values) for t in study.trials)
        best = max((v for t in done for v in t.intermediate_values.values()), default=0.0)
    lines = [x for x in proc.stderr.splitlines() if x.startswith(DECISIONS)]
    return {
        "contender": (f"fuse {fuse}" if fuse else "fuse off")
        + (f", gpus_per_trial {gpus}" if gpus is not None else ""),
        "seed": seed,
        "wall_s": round(wall, 2),
        "trials": len(done),
        "trials_per_hour": round(3600 * len(done) / wall, 1),
        "epochs_per_s": round(epochs_trained / wall, 3),
        "best_val_accuracy": round(best, 4),
        "decisions": lines,
    }


def step_rates(members: list[int], device: str, channels: int = 16) -> list[dict[str, Any]]:
    """Training images per second, fused against one trial after another, per K."""
    import torch

    from search.contract import TrialContext
    from search.contract.dataset import load_digits
    from trainables.knobs import read_config
    from trainables.torch import cnn
    from trainables.torch.fused_loop import FusedArray, fused_tensors
    from trainables.torch.loop import batches, evaluate, make_fitting, train_one_epoch

    data = load_digits(0.2, 0)
    tensors = fused_tensors(data, device)
    rows = []
    for k in members:
        cfgs = [
            read_config({"channels": channels, "lr": 1e-3 * (i + 1)}, cnn.DEFAULTS)
            for i in range(k)
        ]
        ctxs = [TrialContext(max_epochs=3, seed=i) for i in range(k)]
        array = FusedArray(cnn.build_model, tensors, list(zip(cfgs, ctxs, strict=True)))
        array.epoch()
        start = time.perf_counter()
        array.epoch()
        fused_s = time.perf_counter() - start
        alone_s = 0.0
        for cfg, ctx in zip(cfgs, ctxs, strict=True):
            torch.manual_seed(ctx.seed)
            fit = make_fitting(cnn.build_model(cfg, tensors), cfg, ctx, torch.device(device), 1)
            loader = batches(tensors, cfg, ctx, torch.device(device))
            x, y = tensors.x_val, tensors.y_val
            for timed in (False, True):  # an epoch as the array's: training, then validation
                start = time.perf_counter()
                train_one_epoch(fit, loader)
                evaluate(fit.model, x, y, cfg["precision"], torch.device(device))
                alone_s += (time.perf_counter() - start) if timed else 0.0
        images = k * len(tensors.y_train)
        rows.append({
            "members": k,
            "fused_images_per_s": round(images / fused_s),
            "one_after_another_images_per_s": round(images / alone_s),
            "ratio": round(alone_s / fused_s, 2),
        })  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Runs the pair seed by seed and prints the medians and the ratio (``--step``: the
    array's own rate, :func:`step_rates`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--fuse", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--step", action="store_true", help="the array's own images/s")
    parser.add_argument("--members", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.step:
        step_rates(args.members, args.device)
        return
    rows = []
    for seed in args.seeds:
        for fuse in (args.fuse, None):
            rows.append(run_cold(args.trials, args.epochs, seed, fuse))
            print(rows[-1], flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "fused.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    keys = ("wall_s", "trials_per_hour", "epochs_per_s", "best_val_accuracy")
    print("| contender | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for name in dict.fromkeys(r["contender"] for r in rows):
        mine = [r for r in rows if r["contender"] == name]
        print(
            f"| {name} | "
            + " | ".join(str(statistics.median(r[k] for r in mine)) for k in keys)
            + " |"
        )
    ratios = [a["wall_s"] / b["wall_s"] for a, b in zip(rows[::2], rows[1::2], strict=True)]
    print(f"fused / unfused wall time, seed by seed: {', '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
