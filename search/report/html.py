"""``python -m search report``: one HTML page that shows a study, and the same figures as PNGs.

``results/<study>/report.html`` opens offline (plotly.js is embedded once, no CDN). It holds a
summary table (trials by state, compute spent in epochs and seconds, and what ASHA saved
compared to training every trial to the end), the best trial, the confirmation runs of
``export`` when there are any, and the figures of :mod:`search.report.figures` (optimization
history, learning curves styled by state with ASHA's milestones, parameter importances,
parallel coordinates, slices, timeline). The same figures are written as PNGs to
``results/<study>/figures/<name>.png``.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.record.folders import study_folder
from search.record.queries import (
    EPOCHS_FILE,
    best_trial,
    confirmed_order,
    objective_names,
    pareto_trials,
)
from search.record.study import CONFIRM_FILE, CONFIRM_SUFFIX, confirm_storage
from search.report.figures import (
    FIGURES,
    curve_trials,
    metric_curves,
    plotly_figures,
    spec_of,
    uncopied,
)
from search.report.pngs import start_pngs

if TYPE_CHECKING:
    import optuna

    from search.specs.schema import StudySpec


@dataclass(frozen=True)
class Summary:
    """What a study cost, and what ASHA saved."""

    trials: int
    complete: int
    pruned: int
    failed: int
    other: int
    max_epochs: int
    epochs_spent: int
    seconds_spent: float
    epochs_saved: int
    seconds_saved: float
    wall_seconds: float
    best_value: float | None
    best_trial: int | None
    device_budget: tuple[str, float, float] | None = None
    """``(unit, devices a trial holds, budget hours)`` when the spec has a device budget."""

    @property
    def saved_share(self) -> float:
        """Share of the to-the-end compute (in epochs) that ASHA saved."""
        full = self.epochs_spent + self.epochs_saved
        return self.epochs_saved / full if full else 0.0

    def rows(self) -> list[tuple[str, str]]:
        """The summary as ``(label, value)`` rows."""
        best = (
            f"{self.best_value:.4f} (trial {self.best_trial})"
            if self.best_value is not None
            else "none (no COMPLETE trial)"
        )
        rows = [
            ("trials", f"{self.trials}"),
            (
                "complete / pruned / failed",
                f"{self.complete} / {self.pruned} / {self.failed}"
                + (f" ({self.other} other)" if self.other else ""),
            ),
            ("best value", best),
            (
                "compute spent",
                f"{self.epochs_spent} epochs, {self.seconds_spent:.1f} s of trial "
                f"time ({self.wall_seconds:.1f} s wall)",
            ),
            (
                "every trial to the end",
                f"{self.epochs_spent + self.epochs_saved} epochs "
                f"(budget: {self.max_epochs} epochs a trial)",
            ),
            (
                "ASHA saved",
                f"{self.epochs_saved} epochs ({100 * self.saved_share:.0f} %), "
                f"≈ {self.seconds_saved:.1f} s at each pruned trial's own pace",
            ),
        ]
        if self.device_budget is not None:
            unit, devices, hours = self.device_budget
            spent, saved = (devices * s / 3600 for s in (self.seconds_spent, self.seconds_saved))
            rows.append(
                (
                    f"{unit} time",
                    f"{spent:.4g} h spent of a {hours:.4g} h budget; ASHA saved ≈ {saved:.4g} h",
                )
            )
        return rows


def _epochs(trial: optuna.trial.FrozenTrial) -> int:
    value = trial.user_attrs.get("epochs")
    return int(value) if isinstance(value, int | float) else len(trial.intermediate_values)


def _seconds(trial: optuna.trial.FrozenTrial) -> float:
    value = trial.user_attrs.get("seconds")
    if isinstance(value, int | float):
        return float(value)
    if trial.datetime_start and trial.datetime_complete:
        return (trial.datetime_complete - trial.datetime_start).total_seconds()
    return 0.0


def summarize(study: optuna.Study) -> Summary:
    """Counts, compute spent and what ASHA saved (PRUNED trials' missing epochs)."""
    trials = study.get_trials(deepcopy=False)
    states = [t.state.name for t in trials]
    spec = spec_of(study)
    max_epochs = spec.budget.max_epochs if spec else max((_epochs(t) for t in trials), default=0)
    saved_epochs, saved_seconds = 0, 0.0
    for t in trials:
        if t.state.name == "PRUNED":
            missing = max(0, max_epochs - _epochs(t))
            saved_epochs += missing
            saved_seconds += missing * _seconds(t) / max(1, _epochs(t))
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    wall = (max(ends) - min(starts)).total_seconds() if starts and ends else 0.0
    best = best_trial(study)
    counted = ("COMPLETE", "PRUNED", "FAIL")
    return Summary(
        trials=len(trials),
        complete=states.count("COMPLETE"),
        pruned=states.count("PRUNED"),
        failed=states.count("FAIL"),
        other=sum(s not in counted for s in states),
        max_epochs=max_epochs,
        epochs_spent=sum(_epochs(t) for t in trials),
        seconds_spent=sum(_seconds(t) for t in trials),
        epochs_saved=saved_epochs,
        seconds_saved=saved_seconds,
        wall_seconds=wall,
        best_value=best.value if best else None,
        best_trial=best.number if best else None,
        device_budget=_device_budget(spec),
    )


def _device_budget(spec: StudySpec | None) -> tuple[str, float, float] | None:
    """``(unit, devices a trial holds, hours)`` of the stored spec's ``gpu_hours`` or
    ``cpu_hours`` (``None`` without one, or when ``gpus_per_trial`` is ``auto``)."""
    if spec is None:
        return None
    budget, resources = spec.budget, spec.resources
    if budget.gpu_hours:
        gpus = resources.gpus_per_trial
        return ("GPU", float(gpus), budget.gpu_hours) if gpus != "auto" else None
    if budget.cpu_hours:
        return ("CPU", float(resources.cpus_per_trial or 1.0), budget.cpu_hours)
    return None


# --- the page --------------------------------------------------------------------------------


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;
max-width:1280px;color:#222;padding:0 16px}
h1{font-size:1.6em;margin-bottom:4px} h2{font-size:1.2em;margin-top:32px;
border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0;font-size:.92em}
td,th{border:1px solid #ddd;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f4f4f4} .muted{color:#777} .note{color:#a33;font-style:italic}
.fig{margin:8px 0 24px;overflow-x:auto}
"""


def _table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...] = ()) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    head = f"<tr>{cells}</tr>" if header else ""
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table>{head}{body}</table>"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return "" if value is None else str(value)


def confirmation_rows(confirm: optuna.Study) -> list[tuple[str, ...]]:
    """Per source trial: the seeds' values, mean and spread of the latest export run, in the
    order export chose by (:func:`~search.record.queries.confirmed_order`)."""
    import statistics

    trials = [t for t in confirm.get_trials(deepcopy=False) if t.user_attrs.get("role")]
    if not trials:
        return []
    latest = max(str(t.user_attrs.get("export_run", "")) for t in trials)
    groups: dict[int, list[optuna.trial.FrozenTrial]] = {}
    for t in trials:
        if str(t.user_attrs.get("export_run", "")) == latest:
            groups.setdefault(int(t.user_attrs["source_trial"]), []).append(t)
    rows = []
    for number, group in groups.items():
        ok = [t.value for t in group if t.state.name == "COMPLETE" and t.value is not None]
        mean = statistics.fmean(ok) if ok else math.nan
        std = statistics.stdev(ok) if len(ok) > 1 else 0.0
        seeds = ", ".join(
            f"{t.user_attrs.get('seed')}: {_fmt(t.value) if t.value is not None else 'FAIL'}"
            for t in sorted(group, key=lambda t: int(t.user_attrs.get("seed", 0)))
        )
        rows.append((str(number), f"{mean:.4f}", f"{std:.4f}", str(len(group) - len(ok)), seeds))
    mode = "max" if confirm.directions[0].name == "MAXIMIZE" else "min"
    return sorted(rows, key=lambda r: confirmed_order(int(r[3]), float(r[1]), int(r[0]), mode))


def _front_section(study: optuna.Study) -> list[str]:
    """The Pareto front as a table, for a multi-objective study (nothing otherwise)."""
    front = pareto_trials(study) if len(study.directions) > 1 else []
    if not front:
        return []
    names = objective_names(study)
    rows = [
        (
            str(t.number),
            *(_fmt(v) for v in t.values),
            ", ".join(f"{k}={_fmt(v)}" for k, v in t.params.items()),
        )
        for t in front
    ]
    return [
        f"<h2>Pareto front ({len(front)} trials)</h2>",
        _table(rows, ("trial", *names, "params")),
    ]


def render(
    study: optuna.Study, figures: dict[str, Any], confirm: optuna.Study | None = None
) -> str:
    """The whole page; plotly.js is embedded in the first figure, the others reuse it."""
    summary = summarize(study)
    spec = spec_of(study)
    trainable = spec.trainable if spec else "?"
    objective = ", ".join(f"{o.mode} {o.metric}" for o in spec.objectives) if spec else "?"
    parts = [
        f"<h1>Study {html.escape(study.study_name)}</h1>",
        f"<p class='muted'>trainable {html.escape(trainable)}, "
        f"objective {html.escape(objective)}; generated "
        f"{datetime.now().strftime('%Y-%m-%d %H:%M')}</p>",
        "<h2>Summary</h2>",
        _table(summary.rows()),
    ]
    if summary.best_trial is not None:
        best = study.best_trial
        parts += [
            f"<h2>Best trial #{best.number}</h2>",
            _table([(k, _fmt(v)) for k, v in best.params.items()], ("parameter", "value")),
        ]
    parts += _front_section(study)
    if confirm is not None:
        rows = confirmation_rows(confirm)
        if rows:
            parts += [
                f"<h2>Confirmation ({html.escape(confirm.study_name)})</h2>",
                _table(rows, ("source trial", "mean", "std", "failed", "seed: value")),
            ]
    embedded = False
    for name, title in FIGURES:
        if name == "pareto-front" and len(study.directions) == 1:
            continue
        parts.append(f"<h2>{html.escape(title)}</h2>")
        drawn = figures.get(name, "not drawn")
        if isinstance(drawn, str):
            parts.append(f"<p class='note' id='{name}-missing'>{html.escape(drawn)}</p>")
            continue
        for i, figure in enumerate(drawn if isinstance(drawn, list) else [drawn]):
            figure.update_layout(
                height=400 if name in ("slice", "metrics") else 520, margin={"t": 60}
            )
            parts.append(
                "<div class='fig'>"
                + figure.to_html(
                    full_html=False,
                    include_plotlyjs=not embedded,
                    div_id=name if i == 0 else f"{name}-{i + 1}",
                    config={"displaylogo": False},
                )
                + "</div>"
            )
            embedded = True
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(study.study_name)}: search report</title>"
        f"<style>{_CSS}</style></head><body>" + "\n".join(parts) + "</body></html>"
    )


def write_report(
    study: optuna.Study,
    results_dir: Path = Path("results"),
    confirm: optuna.Study | None = None,
    pngs: bool = True,
) -> Path:
    """Writes ``results_dir/<study>/report.html`` and (with ``pngs``) ``figures/*.png``;
    returns the HTML path."""
    folder = study_folder(results_dir, study.study_name)
    folder.mkdir(parents=True, exist_ok=True)
    with uncopied(study):
        drawn = start_pngs(study, folder / "figures") if pngs else None
        shown, _ = curve_trials(study)
        figures = {**plotly_figures(study), "metrics": metric_curves(folder / EPOCHS_FILE, shown)}
        page = render(study, figures, confirm)
        path = folder / "report.html"
        _write_whole(path, page)
        if drawn is not None:
            drawn()
    return path


def _write_whole(path: Path, text: str) -> None:
    """Writes ``path`` whole or not at all: the page goes to a file beside it, renamed over
    ``path`` once written. A write that fails (a full disk) removes that file, so neither a
    cut page nor the space it took is left behind, and an earlier whole page stays."""
    part = path.with_name(f".{path.name}.part")
    try:
        part.write_text(text, encoding="utf-8")
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


def report_study(
    study: optuna.Study, results_dir: Path = Path("results"), pngs: bool = True
) -> Path:
    """The page of ``report`` and of the end of ``run``: :func:`write_report` of ``study``,
    with the confirmation runs of ``<study>-confirm`` when there is one (:func:`confirmation`).
    ``run`` leaves the PNGs out (its exit waits for the report; ``report`` draws them)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return write_report(study, results_dir, confirmation(study, results_dir), pngs)


def confirmation(study: optuna.Study, results_dir: Path) -> optuna.Study | None:
    """The study ``<study>-confirm`` of ``<results>/<study>/confirm.db``, or of the study's
    own storage (where exports before that file recorded it), or ``None``."""
    import optuna

    name = study.study_name + CONFIRM_SUFFIX
    apart = study_folder(results_dir, study.study_name) / CONFIRM_FILE
    places: list[Any] = [confirm_storage(results_dir, study.study_name)] if apart.exists() else []
    for storage in [*places, study._storage]:
        if name in optuna.get_all_study_names(storage):
            return optuna.load_study(study_name=name, storage=storage)
    return None
