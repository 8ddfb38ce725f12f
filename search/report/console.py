"""Console tables: the end-of-run summary and the ``trials`` listing."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from search.errors import SearchError
from search.record.queries import (
    best_trial,
    objective_names,
    pareto_trials,
    state_counts,
    trials_frame,
)
from search.record.resume import IMPORTED

if TYPE_CHECKING:
    import optuna
    from rich.console import Console

    from search.tuning.options import RunSummary


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None or value != value else str(value)  # NaN -> ""


def print_summary(console: Console, study: optuna.Study, summary: RunSummary, folder: Path) -> None:
    """Best value and params, trial states, wall time and where the files are."""
    counts = state_counts(study)
    best = best_trial(study)
    imported = sum(IMPORTED in t.user_attrs for t in study.get_trials(deepcopy=False))
    console.print(f"\n[bold]study[/bold] {study.study_name}  ({summary.storage})")
    console.print(
        f"wall time {summary.seconds:.1f} s, {summary.trials_this_run} trials this run; "
        + ", ".join(f"{counts.get(s, 0)} {s.lower()}" for s in ("COMPLETE", "PRUNED", "FAIL"))
        + (f", {counts['RUNNING']} running" if counts.get("RUNNING") else "")
        + (f" ({imported} of them imported by warm_start)" if imported else "")
    )
    if summary.device_hours is not None:
        spent, budget, unit = summary.device_hours
        reached = "; budget reached, running trials ended PRUNED" if spent >= budget else ""
        console.print(f"{unit} time spent {spent:.4g} h of a {budget:.4g} h budget{reached}")
    if summary.interrupted:
        numbers = ", ".join(str(n) for n in summary.interrupted)
        console.print(
            f"resumed: trials {numbers} were left open by a dead driver (now FAIL, replaced)"
        )
    front = pareto_trials(study) if len(study.directions) > 1 else []
    if front:
        names = objective_names(study)
        console.print(f"Pareto front: {len(front)} trials ({', '.join(names)})")
        for trial in front:
            shown = ", ".join(f"{n}={_fmt(v)}" for n, v in zip(names, trial.values, strict=True))
            console.print(f"  trial {trial.number}: {shown}")
    elif best is None:
        console.print("no trial completed")
    else:
        origin = best.user_attrs.get(IMPORTED)
        where = f", imported from {origin}, not run here" if origin else ""
        console.print(f"best value {best.value:.4f} (trial {best.number}{where})")
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in best.params.items())
        console.print(f"best params {params}")
    console.print(f"results in {folder}/ (trials.csv, best.yaml)")
    if summary.tracking:
        console.print(summary.tracking, markup=False, highlight=False, soft_wrap=True)


TABLE_LIMIT = 500
"""Above this many trials ``trials`` prints plain aligned text instead of a rich table."""


class UnknownMetricError(SearchError):
    """``trials --metrics`` names a metric no trial yielded."""


def print_trials(console: Console, study: optuna.Study, metrics: Sequence[str] = ()) -> None:
    """Every trial of ``study`` as one table row, with the last epoch's value of each of
    ``metrics`` (``["all"]``: every metric the trials yielded).

    Raises:
        UnknownMetricError: When a named metric is not in the study (one line).
    """
    frame = trials_frame(study)
    # What a trial has not (a conditional parameter it did not sample, a FAIL trial's value,
    # the fail reason of one that did not fail) is blank, not "nan"; a metric's NaN is a value
    # the trainable yielded: it stays.
    for column in [c for c in frame.columns if not c.startswith("metric_")]:
        frame[column] = frame[column].astype(object).where(frame[column].notna(), None)
    table = Table(title=f"{study.study_name}: {len(frame)} trials")
    known = [c.removeprefix("metric_") for c in frame.columns if c.startswith("metric_")]
    wanted = known if list(metrics) == ["all"] else list(metrics)
    missing = [m for m in wanted if m not in known]
    if missing:
        raise UnknownMetricError(
            f"--metrics: no trial of {study.study_name!r} yielded "
            f"{missing[0]!r} (known: {', '.join(known) or 'none'})"
        )
    hidden = {"ray_trial_id", "traceback"} | {f"metric_{m}" for m in known if m not in wanted}
    columns = [c for c in frame.columns if c not in hidden]
    names = [c.removeprefix("param_").removeprefix("metric_") for c in columns]
    if len(frame) > TABLE_LIMIT:  # rich lays out every cell: a minute at 10,000 rows
        shown = frame[columns].map(_fmt).set_axis(names, axis=1)
        console.print(table.title, markup=False)
        console.out(shown.to_string(index=False), highlight=False)
        return
    for name in names:
        table.add_column(name, overflow="fold")
    for row in frame[columns].itertuples(index=False):
        table.add_row(*(_fmt(v) for v in row))
    console.print(table)
