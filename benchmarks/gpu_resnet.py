"""The ResNet study of ``benchmarks/gpu_check.py``: solo ceiling, packings, stock Ray Tune.

``torch_resnet`` on the shapes data (``spaces/resnet.yaml``, CIFAR-sized) as a GPU user runs
it, against itself packed by hand and against stock Ray Tune:

- **solo**: the best single trial's training images per second, over batch sizes and
  precisions, one process, nothing else running (:func:`solo`, in a process of its own);
- **studies**: ``python -m search run`` cold from its command line for each contender, for
  ``seconds`` of study (``budget.time_limit_s``) under ASHA: ``auto``, then
  ``gpus_per_trial: 1/k`` for each fixed packing k, then ``auto`` with ASHA off (full
  ``max_epochs`` trials); each with the meter running (:mod:`benchmarks.gpu_meter`):
  images per second summed over trials (epochs trained times the training split, over the
  study's seconds), trials per hour (the trials that finished: complete, or stopped by ASHA;
  not those the time limit cut), SM activity, memory per trial;
- **stock Ray Tune**: ``tune.Tuner`` with ``OptunaSearch``, ``ASHAScheduler`` and
  ``tune.with_resources(..., {"gpu": share})`` as a Ray Tune user writes it, training the same
  trainable through a host ``DataLoader`` (``data_placement: host``), the data passed once
  with ``tune.with_parameters`` (:func:`stock`, its own process).

Sizes: :data:`SIZES` (``gpu`` and the CPU dry run's ``dry``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
SPACE = REPO / "spaces" / "resnet.yaml"

SIZES: dict[str, dict[str, Any]] = {
    "gpu": {
        "data": {"samples": 60000, "val_fraction": 0.16667},
        "fixed": {},
        "max_epochs": 10,
        "seconds": 25,
        "packings": [1, 2, 4, 8, 16],
        "stock_share": 0.25,
        "solo_batches": [256, 512, 1024],
        "precisions": ["fp32", "bf16"],
    },
    "dry": {
        "data": {"samples": 600, "val_fraction": 0.2},
        "fixed": {"width": 8, "depth": 1},
        "max_epochs": 2,
        "seconds": 300,  # a ceiling: the dry run ends after its trials, however slow the hour
        "trials": 2,
        "packings": [1],
        "stock_share": 0.5,
        "solo_batches": [64],
        "precisions": ["fp32", "bf16"],
    },
}


def spec_dict(size: str, name: str, out: Path, gpus: Any, asha: bool = True) -> dict[str, Any]:
    """``spaces/resnet.yaml`` at ``size`` as contender ``name``: its own study and storage."""
    s = SIZES[size]
    spec = yaml.safe_load(SPACE.read_text())
    spec["study"] = f"gpu-check-{name}"
    spec["storage"] = f"sqlite:///{out}/optuna.db"
    spec["data"] = {**spec["data"], **s["data"]}
    spec["budget"] = {
        "trials": s.get("trials", 10_000),
        "max_epochs": s["max_epochs"],
        "time_limit_s": s["seconds"],
    }
    spec["asha"] = {**spec["asha"], "enabled": asha}
    spec["resources"] = {"gpus_per_trial": gpus, "cpus_per_trial": 1}
    spec["fixed"] = {**spec["fixed"], **s["fixed"]}
    if size == "dry":  # this CPU's bf16 autocast is measured in RESULTS; keep the dry run fp32
        spec["space"]["batch_size"] = {"choice": [32, 64]}
        spec["space"].pop("width", None)
    if name == "auto":
        spec["profile"], spec["profile_trial"] = True, 0
    return spec


def study_figures(spec: dict[str, Any], n_train: int, wall: float) -> dict[str, Any]:
    """What the study recorded: trials, finished ones, epochs, images/s, trials per hour.

    Rates are over the study's time: its time limit, or ``wall`` where its trials ran out
    first (the dry run's)."""
    from search.record.study import load_study

    trials = load_study(spec["study"], spec["storage"]).trials
    seconds = min(float(spec["budget"]["time_limit_s"]), wall)
    cut = [t for t in trials if t.user_attrs.get("stopped_by")]
    finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED") and t not in cut]
    epochs = sum(int(t.user_attrs.get("epochs", 0)) for t in trials)
    return {
        "trials": len(trials),
        "finished": len(finished),
        "full": sum(t.state.name == "COMPLETE" for t in finished),
        "epochs": epochs,
        "images_per_s": round(epochs * n_train / seconds, 1),
        "trials_per_hour": round(len(finished) / seconds * 3600, 1),
        "best": max((t.value for t in trials if t.value is not None), default=None),
    }


def run_contender(
    size: str, name: str, out: Path, gpus: Any, asha: bool = True, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """One study from its command line, metered; its figures and its decision line."""
    from benchmarks.gpu_meter import Meter

    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    spec = spec_dict(size, name, out, gpus, asha)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    meter = Meter()
    meter.start()
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "search", "run", str(path), "--results", str(folder / "results")],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - start
    metered = meter.stop()
    (folder / "output.txt").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: exit {done.returncode}: {done.stderr[-2000:]}")
    n_train = round(SIZES[size]["data"]["samples"] * (1 - SIZES[size]["data"]["val_fraction"]))
    lines = (done.stdout + done.stderr).splitlines()
    decisions = [line for line in lines if line.startswith("gpus_per_trial auto")]
    row = {"name": name, "gpus_per_trial": gpus, "asha": asha, "wall_s": round(wall, 1)}
    row.update(study_figures(spec, n_train, wall))
    row.update({"decision": decisions[0] if decisions else None, "meter": metered})
    if name == "auto":
        row["profile"] = attach_profile(spec, folder / "results", out)
    return row


def attach_profile(spec: dict[str, Any], results: Path, out: Path) -> str | None:
    """Trial 0's torch.profiler trace: copied into ``out`` and attached to the trial, so
    optuna-dashboard shows it among the trial's artifacts."""
    import shutil

    from search.record.study import load_study
    from search.report.artifacts import attach_file

    found = sorted(results.rglob("profile-trial0.json"))
    if not found:
        return None
    copy = out / "profile-trial0.json"
    shutil.copyfile(found[0], copy)
    study = load_study(spec["study"], spec["storage"])
    trial = next((t for t in study.trials if t.number == 0), None)
    attach_file(study, copy, trial, results)
    return str(copy)


# ---- one process: the solo ceiling -----------------------------------------------------------


def solo(size: str) -> dict[str, Any]:
    """Training images per second of one trial alone, per batch size and precision (median
    of the epochs after the first), in this process; the best of them."""
    import torch

    from search.contract import TrialContext
    from search.contract.dataset import load_shapes
    from trainables.torch.resnet import train

    s = SIZES[size]
    data = load_shapes(s["data"]["val_fraction"], 0, samples=s["data"]["samples"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fixed = {**yaml.safe_load(SPACE.read_text())["fixed"], **s["fixed"], "width": 64}
    if size == "dry":
        fixed.update(s["fixed"])
    rates: dict[str, float] = {}
    for batch in s["solo_batches"]:
        for precision in s["precisions"]:
            config = {**fixed, "batch_size": batch, "precision": precision, "lr": 1e-3}
            ctx = TrialContext(max_epochs=3, device=device, num_threads=torch.get_num_threads())
            epochs = list(train(config, data, ctx))
            rates[f"{batch}/{precision}"] = round(
                statistics.median(e["train_images_per_s"] for e in epochs[1:]), 1
            )
    best = max(rates, key=rates.__getitem__)
    return {"rates": rates, "best": best, "ceiling_images_per_s": rates[best], "device": device}


# ---- stock Ray Tune, as its user writes it ---------------------------------------------------


def stock(size: str, share: float, out: Path) -> dict[str, Any]:
    """The study with stock Ray Tune at ``gpus_per_trial: share``, in this process."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    from search.contract import TrialContext
    from search.contract.dataset import load_shapes

    s = SIZES[size]
    spec = spec_dict(size, "stock", out, share)
    epochs_max, fixed = s["max_epochs"], {**spec["fixed"], "data_placement": "host"}
    fixed.update({"num_workers": 0, "pin_memory": True})
    data = load_shapes(s["data"]["val_fraction"], 0, samples=s["data"]["samples"])

    def train_fn(config: dict[str, Any], data: Any) -> None:
        import torch  # before the trainable: the guide's import order

        from trainables.torch.resnet import train

        device = "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"
        ctx = TrialContext(max_epochs=epochs_max, device=device, num_threads=1)
        for metrics in train({**fixed, **config}, data, ctx):
            tune.report(metrics)

    space = {
        "lr": tune.loguniform(1e-4, 3e-2),
        "batch_size": tune.choice(spec["space"]["batch_size"]["choice"]),
        "optimizer": tune.choice(["sgd", "adamw"]),
        "momentum": tune.uniform(0.8, 0.95),
        "weight_decay": tune.loguniform(1e-6, 1e-2),
        "lr_scheduler": tune.choice(["onecycle", "cosine", "none"]),
        "label_smoothing": tune.uniform(0.0, 0.3),
        "crop": tune.choice([0, 2, 4]),
        "hflip": tune.choice([True, False]),
    }
    ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False)
    seen: dict[str, list[tuple[float, float]]] = {}  # trial -> (time, epoch_time_s) per epoch

    class Epochs(tune.Callback):
        """Counts each trial's epochs as Tune receives them (the result files may be off)."""

        def on_trial_result(
            self, iteration: int, trials: Any, trial: Any, result: Any, **info: Any
        ) -> None:
            seen.setdefault(trial.trial_id, []).append((time.time(), float(result["epoch_time_s"])))

    start = time.perf_counter()
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(train_fn, data=data), {"cpu": 1, "gpu": share}),
        param_space=space,
        tune_config=tune.TuneConfig(
            search_alg=OptunaSearch(metric="val_accuracy", mode="max"),
            scheduler=ASHAScheduler(
                metric="val_accuracy", mode="max", max_t=epochs_max, grace_period=1,
                reduction_factor=3,
            ),
            num_samples=s.get("trials", 10_000),
            time_budget_s=s["seconds"],
        ),
        run_config=tune.RunConfig(
            storage_path=str(out / "stock" / "ray"), verbose=0, callbacks=[Epochs()]
        ),
    )  # fmt: skip
    grid = tuner.fit()
    wall = time.perf_counter() - start
    epochs = sum(len(v) for v in seen.values())
    end = max((v[-1][0] for v in seen.values()), default=0.0)
    steps = [e for v in seen.values() for _, e in v]
    margin = statistics.median(steps) if steps else 0.0
    finished = sum(1 for v in seen.values() if v[-1][0] < end - margin)
    rows = list(grid)
    n_train = round(s["data"]["samples"] * (1 - s["data"]["val_fraction"]))
    return {
        "name": f"stock Ray Tune at {share}",
        "gpus_per_trial": share,
        "wall_s": round(wall, 1),
        "trials": len(rows),
        "finished": finished,
        "epochs": epochs,
        "images_per_s": round(epochs * n_train / min(s["seconds"], wall), 1),
        "trials_per_hour": round(finished / min(s["seconds"], wall) * 3600, 1),
    }


def in_process(mode: str, size: str, out: Path, share: float, env: dict[str, str]) -> Any:
    """``python benchmarks/gpu_resnet.py MODE SIZE OUT SHARE``: :func:`solo` or :func:`stock`
    in a process of its own (cold, nothing else in it), metered; what it printed last."""
    from benchmarks.gpu_meter import Meter

    meter = Meter()
    meter.start()
    done = subprocess.run(
        [sys.executable, __file__, mode, size, str(out), str(share)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    metered = meter.stop()
    (out / f"{mode}.txt").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"{mode}: exit {done.returncode}: {done.stderr[-2000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "meter": metered}


if __name__ == "__main__":
    mode, size, out, share = sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])
    if os.environ.get("GPU_CHECK_SECONDS"):  # gpu_check --seconds
        SIZES[size]["seconds"] = float(os.environ["GPU_CHECK_SECONDS"])
    result = solo(size) if mode == "solo" else stock(size, share, out)
    print(json.dumps(result))
