"""Start-up: from ``python -m search run`` to the first reported epoch, phase by phase.

The probe (``python -m benchmarks.scale_startup probe OUT.json SPEC ...``) is the real command
line, ``search.cli.app``, in a process that stamps the clock around each step: the functions
the CLI and the runner call are wrapped with timers where they are looked up, and a Tune
callback notes the first trial's start (its actor is up) and its first result. The trainable's
own import is timed apart, in a fresh interpreter. The peer is Optuna in one process on the
same trainable and data: interpreter, imports, data, first epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.scale_head import REPO, driver_env

MARKS: dict[str, float] = {}


def _timed(module: Any, name: str, label: str) -> None:
    """Wraps ``module.name`` so that its end is stamped as ``label``."""
    inner: Callable[..., Any] = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return inner(*args, **kwargs)
        finally:
            MARKS.setdefault(label, time.time())

    setattr(module, name, wrapper)


def _tap() -> Any:
    from ray.tune import Callback

    class FirstEpoch(Callback):
        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            MARKS.setdefault("first actor up", time.time())

        def on_trial_result(
            self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
        ) -> None:
            MARKS.setdefault("first epoch", time.time())
            MARKS["last result"] = time.time()

    return FirstEpoch()


class _LateTap(Sequence[Any]):
    """``[_tap()]``, built when Tune's tuner reads it: the tap imports Ray Tune, and built
    before ``run_study`` it would move that import ahead of the phases being timed."""

    def __init__(self) -> None:
        self._taps: list[Any] = []

    def __getitem__(self, index: Any) -> Any:
        self._taps = self._taps or [_tap()]
        return self._taps[index]

    def __len__(self) -> int:
        return 1


def _instrument() -> None:
    """Stamps spec, preflight, Ray start, study, data and the first trial of ``run``."""
    import dataclasses

    import search.record.lease as lease
    import search.specs.schema as schema
    import search.tuning.preflight as preflight
    import search.tuning.runner as runner

    _timed(schema, "with_overrides", "spec")
    _timed(preflight, "check_run", "preflight")
    _timed(runner, "init_ray", "ray start")
    _timed(runner, "check_knobs", "knob check")
    _timed(runner, "open_study", "study created")
    _timed(lease.StudyLease, "acquire", "study open")
    _timed(runner, "load_data", "data")
    run_study = runner.run_study

    def with_tap(spec: Any, options: Any) -> Any:
        try:
            return run_study(spec, dataclasses.replace(options, callbacks=_LateTap()))
        finally:
            MARKS["run returned"] = time.time()

    runner.run_study = with_tap


def probe(out: str, argv: list[str]) -> None:
    """Runs ``python -m search <argv>`` in this process, stamped; writes the marks to ``out``."""
    MARKS["interpreter"] = time.time()
    import search.cli

    MARKS["cli import"] = time.time()
    _instrument()
    try:
        search.cli.app(argv, standalone_mode=False)
    finally:
        MARKS["exit"] = time.time()
        MARKS["driver imported torch"] = float("torch" in sys.modules)
        Path(out).write_text(json.dumps(MARKS))


ORDER = (
    "interpreter",
    "cli import",
    "spec",
    "preflight",
    "knob check",
    "study created",
    "study open",
    "ray start",
    "data",
    "first actor up",
    "first epoch",
)


def _spawn(args: list[str]) -> tuple[float, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="startup-") as folder:
        out = f"{folder}/marks.json"
        start = time.time()
        cmd = [sys.executable, "-m", "benchmarks.scale_startup", *args[:1], out, *args[1:]]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=driver_env())
        if not Path(out).exists():
            raise SystemExit(f"{args[0]} failed: {done.stderr[-3000:]}")
        return start, json.loads(Path(out).read_text())


def _phases(
    start: float, marks: dict[str, float], order: tuple[str, ...]
) -> list[tuple[str, float]]:
    rows, last = [], start
    for name in order:
        if name in marks:
            rows.append((name, marks[name] - last))
            last = marks[name]
    return rows


def _import_seconds(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    return float(done.stdout.strip() or "nan")


def optuna_probe(out: str) -> None:
    """Optuna in one process on the same trainable and data, stamped to its first epoch."""
    MARKS["interpreter"] = time.time()
    import optuna

    from search.contract import TrialContext
    from search.contract.dataset import load_digits
    from search.specs.schema import load_spec
    from search.specs.space import sample
    from trainables.torch.cnn import train

    MARKS["imports"] = time.time()
    spec = load_spec(REPO / "spaces" / "cnn.yaml")
    data = load_digits(spec.data.val_fraction, spec.data.split_seed)
    MARKS["data"] = time.time()
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    trial = study.ask()
    params = {**spec.fixed, **sample(trial, spec.space)}
    for epoch, metrics in enumerate(train(params, data, TrialContext(max_epochs=1)), 1):
        trial.report(float(metrics["val_accuracy"]), epoch)
        MARKS.setdefault("first epoch", time.time())
    MARKS["exit"] = time.time()
    Path(out).write_text(json.dumps(MARKS))


def main(args: argparse.Namespace) -> None:
    """The start-up mode of ``benchmarks/scale.py``: the default space, 2 trials x 1 epoch."""
    with tempfile.TemporaryDirectory(prefix="startup-run-") as folder:
        cli = [
            "run",
            str(REPO / "spaces" / "cnn.yaml"),
            "--trials",
            "2",
            "--max-epochs",
            "1",
            "--storage",
            f"sqlite:///{folder}/o.db",
            "--results",
            f"{folder}/r",
        ]
        ours_start, ours = _spawn(["probe", *cli])
    peer_start, peer = _spawn(["optuna"])
    trainable = _import_seconds("trainables.torch.cnn")
    print("start-up to the first reported epoch (digits CNN, cold processes)")
    print(f"{'phase':<28} {'ours s':>7}   {'phase':<14} {'optuna s':>8}")
    left = _phases(ours_start, ours, ORDER)
    right = _phases(peer_start, peer, ("interpreter", "imports", "data", "first epoch"))
    for i in range(max(len(left), len(right))):
        a = f"{left[i][0]:<28} {left[i][1]:>7.2f}" if i < len(left) else " " * 36
        b = f"{right[i][0]:<14} {right[i][1]:>8.2f}" if i < len(right) else ""
        print(f"{a}   {b}")
    first = ours.get("first epoch", float("nan")) - ours_start
    print(
        f"{'to first epoch':<28} {first:>7.2f}   {'':<14} {peer['first epoch'] - peer_start:>8.2f}"
    )
    print(f"  of which the trainable's import (torch), cold, timed apart: {trainable:.2f} s")
    after = ours.get("exit", float("nan")) - ours.get("last result", float("nan"))
    print(f"  after its last result: {after:.2f} s to exit (tell, results, report, Ray shutdown)")
    print(f"  the driver imported torch: {'yes' if ours.get('driver imported torch') else 'no'}")


if __name__ == "__main__":
    if sys.argv[1] == "probe":
        os.environ.setdefault("SEARCH_NUM_CPUS", "2")
        probe(sys.argv[2], sys.argv[3:])
    else:
        optuna_probe(sys.argv[2])
