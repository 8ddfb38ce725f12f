"""torch_resnet on the shapes data, on this CPU: the landscape a search finds, and the levers.

Each contender runs cold, in a process of its own started from its command line (``--one``),
training one config of ``torch_resnet`` with the trainable's own code, and prints its epochs.
The report:

- accuracy: the reference config's val_accuracy after each epoch (what the docs state);
- landscape: the same config at five learning rates, and with the crop and flip on and off at
  a quarter of the training split (what a search must find: lr and augmentation matter);
- speed: training images per second (median of the epochs after the first) for precision
  fp32 against bf16, memory_format contiguous against channels_last, data_placement host
  against device, and compile off against on, with the compiled process's first epoch, its
  second trial's first epoch (the graph reused in the process) and a new process's first
  epoch with the on-disk cache warm.

    python benchmarks/resnet_cpu.py                      # everything (a few minutes on 2 cores)
    python benchmarks/resnet_cpu.py --only speed         # one part: accuracy | landscape | speed

Writes results/benchmarks/resnet_cpu.json.
"""

from __future__ import annotations

import argparse
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

DATA = {"samples": 5000, "difficulty": 0.5}
"""4,000 training and 1,000 validation images of 32x32x3."""
REFERENCE = {
    "width": 16,
    "depth": 2,
    "optimizer": "adamw",
    "lr": 1e-2,
    "batch_size": 128,
    "lr_scheduler": "onecycle",
    "weight_decay": 5e-4,
    "crop": 2,
    "hflip": True,
    "data_placement": "device",
}
"""The config whose accuracy the docs state."""
EPOCHS = 8
SPEED_EPOCHS = 3
AUGMENT_FRACTION, AUGMENT_EPOCHS = 0.5, 16
"""Augmentation matters where a model overfits: half the training split, twice the epochs."""


def one(config: dict[str, Any], epochs: int, trials: int = 1) -> list[list[dict[str, float]]]:
    """Trains ``config`` ``trials`` times in this process; each trial's epochs."""
    import torch

    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    from search.contract import TrialContext
    from search.contract.dataset import load_shapes
    from trainables.torch.resnet import train

    data = load_shapes(0.2, 0, **DATA)
    runs = []
    for _ in range(trials):
        ctx = TrialContext(max_epochs=epochs, num_threads=torch.get_num_threads())
        runs.append(list(train(config, data, ctx)))
    return runs


def contender(config: dict[str, Any], epochs: int, trials: int = 1, **env: str) -> dict[str, Any]:
    """:func:`one` in a new process, cold; its epochs and its wall time."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, __file__, "--one", json.dumps(config), str(epochs), str(trials)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    return {"config": config, "runs": runs, "wall_s": round(time.perf_counter() - start, 2)}


def rate(run: list[dict[str, float]]) -> float:
    """Training images per second: the median of the epochs after the first."""
    return statistics.median(e["train_images_per_s"] for e in run[1:] or run)


def accuracy() -> dict[str, Any]:
    result = contender(REFERENCE, EPOCHS)
    curve = [round(e["val_accuracy"], 4) for e in result["runs"][0]]
    print(f"accuracy: reference config, {EPOCHS} epochs: val_accuracy {curve}")
    return {"config": REFERENCE, "val_accuracy": curve, "wall_s": result["wall_s"]}


def landscape() -> dict[str, Any]:
    out: dict[str, Any] = {"lr": {}, "augment": {}}
    for lr in (1e-4, 1e-3, 3e-3, 1e-2, 3e-2):
        run = contender({**REFERENCE, "lr": lr}, EPOCHS)["runs"][0]
        out["lr"][lr] = round(run[-1]["val_accuracy"], 4)
        print(f"landscape: lr {lr:g}: val_accuracy {out['lr'][lr]} after {EPOCHS} epochs")
    for name, aug in (
        ("crop 2 + flip", {"crop": 2, "hflip": True}),
        ("none", {"crop": 0, "hflip": False}),
    ):
        config = {**REFERENCE, **aug, "train_fraction": AUGMENT_FRACTION}
        run = contender(config, AUGMENT_EPOCHS)["runs"][0]
        out["augment"][name] = round(max(e["val_accuracy"] for e in run), 4)
        print(f"landscape: {AUGMENT_FRACTION} of the training split, augmentation {name}: "
              f"best val_accuracy {out['augment'][name]} in {AUGMENT_EPOCHS} epochs")  # fmt: skip
    return out


def speed() -> dict[str, Any]:
    pairs = {
        "precision": [{"precision": "fp32"}, {"precision": "bf16"}],
        "memory_format": [{"memory_format": "contiguous"}, {"memory_format": "channels_last"}],
        "data_placement": [{"data_placement": "host"}, {"data_placement": "device"}],
    }
    out: dict[str, Any] = {}
    for name, (base, other) in pairs.items():
        a = rate(contender({**REFERENCE, **base}, SPEED_EPOCHS)["runs"][0])
        b = rate(contender({**REFERENCE, **other}, SPEED_EPOCHS)["runs"][0])
        out[name] = {str(base[name]): round(a, 1), str(other[name]): round(b, 1),
                     "ratio": round(b / a, 3)}  # fmt: skip
        print(f"speed: {name}: {base[name]} {a:.0f} images/s, {other[name]} {b:.0f} images/s "
              f"({b / a:.2f}x)")  # fmt: skip
    out["compile"] = compile_speed()
    return out


def compile_speed() -> dict[str, Any]:
    """compile off and on, cold; on: two trials in one process, then a new process with the
    on-disk cache the first one filled."""
    cache = tempfile.mkdtemp(prefix="inductor-")
    off = contender(REFERENCE, SPEED_EPOCHS)
    on = contender({**REFERENCE, "compile": True}, SPEED_EPOCHS, 2, TORCHINDUCTOR_CACHE_DIR=cache)
    warm = contender({**REFERENCE, "compile": True}, SPEED_EPOCHS, TORCHINDUCTOR_CACHE_DIR=cache)
    first = lambda r: round(r[0]["epoch_time_s"], 2)  # noqa: E731
    result = {
        "off_images_per_s": round(rate(off["runs"][0]), 1),
        "on_images_per_s": round(rate(on["runs"][0]), 1),
        "off_first_epoch_s": first(off["runs"][0]),
        "on_first_epoch_s_cold": first(on["runs"][0]),
        "on_first_epoch_s_same_process_next_trial": first(on["runs"][1]),
        "on_first_epoch_s_new_process_disk_cache": first(warm["runs"][0]),
        "off_wall_s": off["wall_s"],
        "on_wall_s_two_trials": on["wall_s"],
        "on_wall_s_disk_cache": warm["wall_s"],
    }
    print(f"speed: compile: {json.dumps(result)}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=("accuracy", "landscape", "speed"))
    parser.add_argument(
        "--one", nargs=3, metavar=("CONFIG", "EPOCHS", "TRIALS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.one:
        runs = one(json.loads(args.one[0]), int(args.one[1]), int(args.one[2]))
        print(json.dumps(runs))
        return
    parts = {"accuracy": accuracy, "landscape": landscape, "speed": speed}
    result: dict[str, Any] = {"load_before": os.getloadavg(), "data": DATA}
    for name, part in parts.items():
        if args.only in (None, name):
            result[name] = part()
    result["load_after"] = os.getloadavg()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "resnet_cpu.json").write_text(json.dumps(result, indent=2))
    load = f"load average {result['load_before']} -> {result['load_after']}"
    print(f"wrote {OUT / 'resnet_cpu.json'} ({load})")


if __name__ == "__main__":
    main()
