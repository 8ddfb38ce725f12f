"""The index of ``export --pareto``: ``pareto.csv``, ``PARETO.md`` and ``pareto.png``.

One row per point of the front, best confirmed mean on the primary objective first (points
whose runs all failed last). Per objective: the search trial's value and the confirmed mean,
sample standard deviation, min and max over the fresh seeds, and the final model's value.
``confirmed_front`` says whether the point is still non-dominated on confirmed means: a point
on the search's front can fall behind another once fresh seeds measure both.

``pareto.png`` (matplotlib, Agg): with two objectives, every COMPLETE search trial in grey
and each point's confirmed mean with error bars of one standard deviation on both axes, a
dotted line from its search value. With three or more, the same plot of the first two, and a
note that the table has the rest.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from search.record.pareto import pareto_front
from search.report.pngs import legend

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from search.handover.bundle import ExportResult, Session
    from search.handover.confirm import Row

STATS = ("mean", "std", "min", "max")


@dataclass(frozen=True)
class ParetoPoint:
    """One point of the front: its confirmation and its bundle."""

    row: Row  # the confirmation on the primary objective
    confirmed: dict[str, dict[str, Any]]  # objective -> mean, std, min, max, failed
    search: dict[str, float]  # objective -> the search trial's value
    bundle: ExportResult | None  # None when every confirmation run failed

    @property
    def trial(self) -> int:
        return self.row.source_trial


def write_index(out: Path, session: Session, points: Sequence[ParetoPoint]) -> list[Path]:
    """Writes the three index files in ``out``; returns their paths."""
    on_front = confirmed_front(session, points)
    files = [out / "pareto.csv", out / "PARETO.md", out / "pareto.png"]
    write_csv(files[0], session, points, on_front)
    files[1].write_text(markdown(session, points, on_front))
    plot(files[2], session, points)
    return files


def confirmed_front(session: Session, points: Sequence[ParetoPoint]) -> set[int]:
    """The trials no other point dominates on confirmed means (a failed mean: NaN, last)."""
    objectives = session.spec.objectives
    means = [[_nan(p.confirmed[o.metric]["mean"]) for o in objectives] for p in points]
    return {points[i].trial for i in pareto_front(means, [o.mode for o in objectives])}


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def write_csv(
    path: Path, session: Session, points: Sequence[ParetoPoint], on_front: set[int]
) -> None:
    """``pareto.csv``: one row per point (module docstring), ``param_<name>`` columns last."""
    names = [o.metric for o in session.spec.objectives]
    params = sorted({k for p in points for k in p.row.params})
    header = ["trial", "bundle", "confirmed_front", "runs", "failed_runs", "final_seed"]
    for m in names:
        header += [f"search_{m}", *(f"{m}_{s}" for s in STATS), f"{m}_final"]
    header += [f"param_{k}" for k in params]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for p in points:
            bundle = p.bundle
            row: list[Any] = [
                p.trial,
                f"trial-{p.trial}" if bundle else "",
                p.trial in on_front,
                len(p.row.values),
                p.row.failed,
                bundle.seed if bundle else "",
            ]
            for m in names:
                final = bundle.final.get(m) if bundle else None
                row += [p.search[m], *(_cell(p.confirmed[m][s]) for s in STATS), _cell(final)]
            row += [p.row.params.get(k, "") for k in params]
            writer.writerow(row)


def _cell(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def markdown(session: Session, points: Sequence[ParetoPoint], on_front: set[int]) -> str:
    """``PARETO.md``: what was confirmed, the table, the figure, how to export one point."""
    spec, study = session.spec, session.study.study_name
    names = [o.metric for o in spec.objectives]
    header = ["trial", *(f"{o.metric} ({o.mode})" for o in spec.objectives)]
    header += ["failed runs", "confirmed front", "bundle", "params"]
    lines = [
        f"# Pareto front of `{study}`",
        "",
        f"{len(points)} point(s) of the search's Pareto front, each trained again with the "
        f"seeds {', '.join(map(str, session.seeds))} at {spec.budget.max_epochs} epochs "
        f"(study `{session.confirm.study_name}`). Cells: confirmed mean ± sample std "
        "(search trial's value). *Confirmed front*: no other point is better on every "
        "confirmed mean.",
        "",
        "| " + " | ".join(header) + " |",
        "|---" * len(header) + "|",
    ]
    for p in points:
        cells = [str(p.trial)]
        for m in names:
            stats = p.confirmed[m]
            mean = "FAIL" if stats["mean"] is None else f"{stats['mean']:.4g} ± {stats['std']:.2g}"
            cells.append(f"{mean} ({p.search[m]:.4g})")
        link = f"[trial-{p.trial}/](trial-{p.trial}/MODEL_CARD.md)" if p.bundle else "none"
        params = ", ".join(f"`{k}={_g(v)}`" for k, v in p.row.params.items())
        cells += [str(p.row.failed), "yes" if p.trial in on_front else "no", link, params]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "![Pareto front](pareto.png)",
        "",
        "One point alone, chosen by a constraint (the best on "
        f"{spec.primary.metric} among those that satisfy it):",
        "",
        f"    python -m search export {study} --pick '{names[1]}<...'",
        "",
    ]
    return "\n".join(lines)


def _g(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def plot(path: Path, session: Session, points: Sequence[ParetoPoint]) -> None:
    """``pareto.png`` (module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objectives = session.spec.objectives
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    searched = [t.values for t in session.study.get_trials(deepcopy=False) if t.values]
    xs, ys = [v[0] for v in searched], [v[1] for v in searched]
    ax.scatter(xs, ys, color="0.75", s=14, label="search trials (COMPLETE)", zorder=1)
    label = f"confirmed mean ± std ({len(session.seeds)} seeds)"
    _draw_points(ax, points, objectives[0].metric, objectives[1].metric, label)
    ax.set(
        xlabel=f"{objectives[0].metric} ({objectives[0].mode})",
        ylabel=f"{objectives[1].metric} ({objectives[1].mode})",
        title=f"Pareto front of {session.study.study_name}",
    )
    if len(objectives) > 2:
        rest = ", ".join(o.metric for o in objectives[2:])
        note = f"{len(objectives)} objectives: the first two shown; {rest} in PARETO.md"
        fig.text(0.01, 0.01, note, fontsize=8)
    legend(ax, loc="best", fontsize=8)
    fig.tight_layout(rect=(0.0, 0.03 if len(objectives) > 2 else 0.0, 1.0, 1.0))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _draw_points(ax: Any, points: Sequence[ParetoPoint], x: str, y: str, label: str) -> None:
    """Each point's confirmed mean with one std on both axes, a dotted line from its search
    value, and its trial number."""
    for p in points:
        mx, my = p.confirmed[x], p.confirmed[y]
        if mx["mean"] is None or my["mean"] is None:
            continue
        ax.plot([p.search[x], mx["mean"]], [p.search[y], my["mean"]], ":", color="0.4", lw=0.8)
        ax.errorbar(
            mx["mean"],
            my["mean"],
            xerr=mx["std"],
            yerr=my["std"],
            fmt="o",
            color="C0",
            capsize=3,
            zorder=3,
            label=label,
        )
        label = "_nolegend_"
        ax.annotate(
            f"trial {p.trial}",
            (mx["mean"], my["mean"]),
            textcoords="offset points",
            xytext=(5, 5),
            fontsize=8,
        )
