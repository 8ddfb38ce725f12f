"""What a run leaves on disk: ``trials.csv`` and ``best.yaml`` under ``results/<study>/``.

``best.yaml`` is itself a spec: the best COMPLETE trial's parameters merged into ``fixed``, an
empty space, one trial, ASHA off and the seed that trial trained with, so
``python -m search run results/<study>/best.yaml`` trains that config again.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from search.record.folders import study_folder
from search.record.storage import redact
from search.specs.derive import one_trial_spec

if TYPE_CHECKING:
    import optuna
    import pandas as pd

    from search.specs.schema import StudySpec

ATTR_COLUMNS = ("epochs", "seconds", "device", "node", "fail_reason", "traceback", "ray_trial_id")


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """One row per trial: number, state, value, each parameter, epochs, seconds, and more, and
    ``metric_<name>`` for every metric the trainable yielded at its last epoch.

    A multi-objective study has ``value_<metric>`` per objective instead of ``value``, and
    ``pareto`` (whether the trial is on the Pareto front)."""
    import pandas as pd

    names = objective_names(study)
    front = {t.number for t in pareto_trials(study)} if len(names) > 1 else set()
    rows = []
    for trial in study.get_trials(deepcopy=False):
        row: dict[str, Any] = {"number": trial.number, "state": trial.state.name}
        if len(names) == 1:
            row["value"] = trial.values[0] if trial.values else None
        else:
            values = trial.values or [None] * len(names)
            row.update({f"value_{n}": v for n, v in zip(names, values, strict=True)})
            row["pareto"] = trial.number in front
        row.update({f"param_{k}": v for k, v in trial.params.items()})
        row.update({k: trial.user_attrs.get(k) for k in ATTR_COLUMNS})
        metrics = trial.user_attrs.get("metrics")
        if isinstance(metrics, dict):
            row.update({f"metric_{k}": v for k, v in metrics.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def state_counts(study: optuna.Study) -> dict[str, int]:
    """How many trials are in each state, e.g. ``{"COMPLETE": 9, "PRUNED": 20}``."""
    return dict(Counter(t.state.name for t in study.get_trials(deepcopy=False)))


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The best COMPLETE trial, or ``None`` when there is none or the study has several
    objectives (it has a front: :func:`pareto_trials`)."""
    from optuna.trial import TrialState

    if len(study.directions) > 1:
        return None
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    return study.best_trial


def confirmed_order(
    failed: int, mean: float | None, trial: int, mode: str
) -> tuple[int, float, int]:
    """The one order of confirmed candidates: export takes the first, the report lists them
    so. Fewest failed runs, then the best mean in ``mode``'s direction, then the lower trial.

    Example:
        >>> rows = [(0, 0.9, 3), (1, 0.95, 5), (0, 0.8, 8)]  # (failed, mean, trial)
        >>> [t for f, m, t in sorted(rows, key=lambda r: confirmed_order(*r, mode="max"))]
        [3, 8, 5]
    """
    sign = -1.0 if mode == "max" else 1.0
    ranked = math.inf if mean is None or math.isnan(mean) else sign * mean
    return failed, ranked, trial


def pareto_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The COMPLETE trials no other COMPLETE trial dominates (the best one, with a single
    objective), by number."""
    from optuna.trial import TrialState

    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return []
    return sorted(study.best_trials, key=lambda t: t.number)


def objective_names(study: optuna.Study) -> list[str]:
    """The study's objective names (its metric names; ``objective_<i>`` where unset)."""
    names = study.metric_names
    return list(names) if names else [f"objective_{i}" for i in range(len(study.directions))]


def best_spec(spec: StudySpec, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The spec that trains ``trial``'s config again, exactly (same seed)."""
    seed = (spec.sampler.seed or 0) + trial.number
    return one_trial_spec(spec, {**spec.fixed, **trial.params}, seed, "-best", redact(spec.storage))


EPOCHS_FILE = "epochs.csv"
"""Every numeric metric of every trial, per epoch: ``trial,epoch,metric,value`` rows."""


def append_epochs(path: Path, number: int, metrics: Mapping[int, Mapping[str, float]]) -> None:
    """Adds one finished trial's per-epoch metrics to the long table at ``path``."""
    new = not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(["trial", "epoch", "metric", "value"])
        for epoch in sorted(metrics):
            for name, value in sorted(metrics[epoch].items()):
                writer.writerow([number, epoch, name, repr(value)])


def read_epochs(path: Path) -> dict[int, dict[str, dict[int, float]]]:
    """The table :func:`append_epochs` writes, as trial -> metric -> epoch -> value (empty
    when there is none; rows that are not numbers are left out).

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / EPOCHS_FILE
        >>> append_epochs(path, 3, {1: {"acc": 0.5}, 2: {"acc": 0.7, "latency_ms": 2.0}})
        >>> read_epochs(path)
        {3: {'acc': {1: 0.5, 2: 0.7}, 'latency_ms': {2: 2.0}}}
    """
    table: dict[int, dict[str, dict[int, float]]] = {}
    if not path.is_file():
        return table
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            try:
                trial, epoch, value = int(row["trial"]), int(row["epoch"]), float(row["value"])
            except (TypeError, ValueError):
                continue
            table.setdefault(trial, {}).setdefault(row["metric"], {})[epoch] = value
    return table


def objective_curves(
    table: Mapping[int, Mapping[str, Mapping[int, float]]], metrics: list[str]
) -> list[dict[int, tuple[float, ...]]]:
    """Each trial's objective vectors by epoch (epochs with every one of ``metrics``), for
    MO-ASHA's rungs on a resume.

    Example:
        >>> objective_curves({0: {"a": {1: 0.5, 2: 0.6}, "b": {1: 3.0}}}, ["a", "b"])
        [{1: (0.5, 3.0)}]
    """
    curves = []
    for metrics_of in table.values():
        epochs = set.intersection(*(set(metrics_of.get(m, {})) for m in metrics))
        curves.append({e: tuple(metrics_of[m][e] for m in metrics) for e in sorted(epochs)})
    return curves


def write_results(study: optuna.Study, spec: StudySpec, results_dir: Path) -> Path:
    """Writes ``trials.csv`` (and ``best.yaml`` when a trial completed); returns the folder."""
    out = study_folder(results_dir, spec.study)
    out.mkdir(parents=True, exist_ok=True)
    trials_frame(study).to_csv(out / "trials.csv", index=False)
    best = best_trial(study)
    if best is not None:
        text = yaml.safe_dump(best_spec(spec, best), sort_keys=False)
        (out / "best.yaml").write_text(f"# best trial #{best.number}: {best.value}\n{text}")
    return out
