"""The driver's memory with a large loader: how many copies of the data ``run`` keeps.

Runs ``python -m search run`` of 2 trials cold, twice, as a user does: once with a loader
that returns ``--mb`` MB of arrays, once with 1 MB (the baseline: Ray, Optuna and the
trainable's imports). Every 0.1 s it samples the driver's RSS and PSS
(``/proc/PID/smaps_rollup``; PSS counts a page shared with Ray's object store by its share)
and the PSS of all the driver's processes (Ray's and the trials' workers too: PSS adds up
where RSS counts a shared page in each process). It prints, side by side, the peaks, what the
driver holds while trials run (the median of the run's second half), and the extra over the
baseline in copies of the data. The driver's peak floor is one copy (the loader builds the
arrays in the driver before they reach the object store); while trials run, it is none
beyond the object store's.

    python benchmarks/memory.py --mb 200        # results/benchmarks/memory.csv
    python benchmarks/memory.py --repo ../old   # the same against another checkout
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def load(mb: float) -> dict[str, Any]:
    """A loader: ``mb`` MB of float32 training rows, and a small validation split."""
    rows = max(1, int(mb * 2**20 / (64 * 4)))
    rng = np.random.default_rng(0)
    x = rng.random((rows, 64), dtype=np.float32)
    return {"x_train": x, "y_train": np.zeros(rows, np.int64), "x_val": x[:100], "y_val": None}


def train(config: Mapping[str, Any], data: Any, ctx: Any) -> Iterator[dict[str, float]]:
    """A trainable that reads every row each epoch (so the data is really mapped)."""
    for _ in range(2):
        mean = float(np.asarray(data["x_train"]).mean())
        yield {"val_accuracy": float(config["x"]) * mean}


def _spec(folder: Path, mb: float) -> Path:
    import yaml

    spec = {
        "study": f"memory-{mb:g}",
        "trainable": "benchmarks.memory:train",
        "data": {"loader": "benchmarks.memory:load", "args": {"mb": mb}},
        "objective": {"metric": "val_accuracy", "mode": "max"},
        "budget": {"trials": 2, "max_epochs": 2},
        "sampler": {"name": "random", "seed": 0},
        "storage": f"sqlite:///{folder}/optuna.db",
        "space": {"x": {"uniform": [0.0, 1.0]}},
    }
    path = folder / f"memory-{mb:g}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _memory_kb(pid: int) -> tuple[int, int]:
    """``(rss, pss)`` of ``pid`` in kB, or zeros once it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    values = {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()[1:]}
    return values.get("Rss", 0), values.get("Pss", 0)


def _tree_pss_kb(pid: int) -> int:
    """The PSS of ``pid`` and every process under it, in kB."""
    import psutil

    try:
        pids = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return 0
    return sum(_memory_kb(p)[1] for p in pids)


def measure(repo: Path, mb: float) -> dict[str, float]:
    """Peak driver RSS and PSS (MB) of one cold ``run`` with ``mb`` MB of data."""
    with tempfile.TemporaryDirectory(prefix="search-memory-") as tmp:
        folder = Path(tmp)
        spec = _spec(folder, mb)
        cmd = [sys.executable, "-m", "search", "run", str(spec), "--results", str(folder / "r")]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        samples: list[tuple[int, int, int]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append((*_memory_kb(proc.pid), _tree_pss_kb(proc.pid)))
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, err = proc.communicate(timeout=900)
        stop.set()
        sampler.join()
        if proc.returncode != 0:
            raise SystemExit(f"run failed ({proc.returncode}): {err.decode()[-2000:]}")
    seconds = time.monotonic() - start
    live = [s for s in samples if s[0] > 0]
    held = live[len(live) // 2 :]
    rss, pss = (sorted(s[i] for s in held)[len(held) // 2] / 1024 for i in (0, 1))
    return {
        "data_mb": mb,
        "peak_rss_mb": max(s[0] for s in live) / 1024,
        "peak_pss_mb": max(s[1] for s in live) / 1024,
        "held_rss_mb": rss,
        "held_pss_mb": pss,
        "peak_all_pss_mb": max(s[2] for s in live) / 1024,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200.0, help="the large loader's size")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout to run")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks")
    args = parser.parse_args()
    base, big = measure(args.repo, 1.0), measure(args.repo, args.mb)
    rows = [base, big]
    keys = [k for k in base if k.endswith("_mb") and k != "data_mb"]
    print(f"{'data MB':>8} " + " ".join(f"{k.removesuffix('_mb'):>9}" for k in keys) + "  seconds")
    for row in rows:
        values = " ".join(f"{row[k]:>9.0f}" for k in keys)
        print(f"{row['data_mb']:>8.0f} {values} {row['seconds']:>8.1f}")
    for key in keys:
        copies = (big[key] - base[key]) / args.mb
        print(f"{key.removesuffix('_mb')} over the 1 MB baseline: {copies:.2f} copies of the data")
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "memory.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(base))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
