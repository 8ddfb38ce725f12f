"""Per-trial artifacts for optuna-dashboard: each finished trial's learning curves and metrics.

A trial's numbers live in the study, but its other metrics (loss, accuracy, whatever the
trainable yields) only in ``results/<study>/epochs.csv``, which the dashboard cannot read. So
each finished trial that trained gets two files in the study's artifact store
(:mod:`search.record.artifacts`, under ``results/<study>/artifacts``): a PNG of every numeric
metric per epoch and the same numbers as a CSV table. A trial that has both files is skipped,
so publishing again costs one read.
"""

from __future__ import annotations

import csv
import math
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from search.record.artifacts import attached, made, store_path, upload
from search.record.queries import EPOCHS_FILE, read_epochs

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

Curves = dict[str, list[tuple[int, float]]]
"""One trial's metrics: each name's ``(epoch, value)`` points, by epoch."""


def read_curves(table: Path) -> dict[int, Curves]:
    """Every trial's metrics from ``epochs.csv`` (``trial,epoch,metric,value`` rows); empty
    when there is no table. Values that are not numbers are left out."""
    curves = read_epochs(table)
    return {
        number: {name: sorted(points.items()) for name, points in metrics.items()}
        for number, metrics in curves.items()
    }


def trial_curves(trial: FrozenTrial, table: dict[int, Curves], objective: str) -> Curves:
    """``trial``'s curves from the table, else its intermediate values named ``objective``."""
    if trial.number in table:
        return table[trial.number]
    points = sorted((int(step), float(v)) for step, v in trial.intermediate_values.items())
    return {objective: points} if points else {}


class CurveFigure:
    """One figure, one small panel per metric, drawn again for each trial with those metrics.

    Building the axes costs more than drawing them, so a study's trials (which mostly share
    their metrics) reuse one figure, a fraction of the cost of a new one. No pyplot (no
    global state, nothing to close), no layout engine (constrained layout doubles the time).
    """

    def __init__(self, names: tuple[str, ...]) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        cols = min(3, len(names))
        rows = -(-len(names) // cols)
        self.fig = Figure(figsize=(3.6 * cols, 2.6 * rows + 0.5))
        FigureCanvasAgg(self.fig)
        self.axes = list(self.fig.subplots(rows, cols, squeeze=False).ravel())
        self.lines = {}
        for ax, name in zip(self.axes, names, strict=False):
            (self.lines[name],) = ax.plot([], [], marker="o", markersize=3)
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("epoch", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.locator_params(nbins=4)
            ax.locator_params(axis="x", integer=True)
            ax.grid(alpha=0.3)
        for ax in self.axes[len(names) :]:
            ax.set_visible(False)
        top = 1 - 0.5 / (2.6 * rows + 0.5)
        self.fig.subplots_adjust(
            left=0.08, right=0.97, bottom=0.1, top=top - 0.06, wspace=0.3, hspace=0.6
        )
        self.title = self.fig.suptitle("", fontsize=10, y=top + 0.02)

    def draw(self, curves: Curves, title: str, path: Path) -> None:
        """Writes ``curves`` (the metrics this figure was built for) to ``path`` as a PNG."""
        for name, line in self.lines.items():
            points = [(e, v) for e, v in curves[name] if math.isfinite(v)]
            line.set_data([e for e, _ in points], [v for _, v in points])
            line.axes.relim()
            line.axes.autoscale_view()
        self.title.set_text(title)
        self.fig.savefig(path, dpi=80)


def write_table(curves: Curves, path: Path) -> None:
    """The curves as a CSV table: one row per epoch, one column per metric."""
    names = sorted(curves)
    by_epoch: dict[int, dict[str, float]] = defaultdict(dict)
    for name in names:
        for epoch, value in curves[name]:
            by_epoch[epoch][name] = value
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["epoch", *names])
        for epoch in sorted(by_epoch):
            writer.writerow([epoch, *(repr(by_epoch[epoch].get(n, "")) for n in names)])


ARTIFACT_LIMIT = 300
"""The most trials that get artifacts: every COMPLETE one first (by number), then the latest
others. Drawing costs time per trial, so 10,000 trials would take many minutes
(and optuna-dashboard itself does not go beyond 10,000 trials)."""


def publish_artifacts(study: optuna.Study, results_dir: Path, limit: int = ARTIFACT_LIMIT) -> int:
    """Gives each finished trial that trained its learning-curve PNG and metrics CSV.

    Args:
        study: The study; COMPLETE, PRUNED and FAIL trials with at least one epoch count,
            at most ``limit`` of them (:data:`ARTIFACT_LIMIT`).
        results_dir: The results folder; reads ``<study>/epochs.csv``, writes
            ``<study>/artifacts``.

    Returns:
        How many trials got artifacts now. Those that have them are skipped; a file whose
        metadata is there but whose bytes are not (a results folder deleted or moved) is
        written again under its artifact id.
    """
    from optuna.trial import TrialState

    finished = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    folder = store_path(results_dir, study.study_name)
    have = attached(study)
    done = study.get_trials(deepcopy=False, states=finished)
    complete = [t for t in done if t.state == TrialState.COMPLETE]
    others = [t for t in done if t.state != TrialState.COMPLETE]
    chosen = (complete + others[::-1])[:limit]
    todo = [
        (t, lacking)
        for t in sorted(chosen, key=lambda t: t.number)
        if (lacking := _lacking(t, have.get(t._trial_id, {}), folder))
    ]
    return _publish(study, todo, have, folder) if todo else 0


def _publish(
    study: optuna.Study,
    todo: list[tuple[FrozenTrial, set[str]]],
    have: dict[int | None, dict[str, str]],
    folder: Path,
) -> int:
    """Draws, writes and uploads each trial's lacking files; how many trials had curves."""
    from optuna.artifacts import FileSystemArtifactStore

    table = read_curves(folder.parent / EPOCHS_FILE)
    objective = (study.metric_names or ["value"])[0]
    store = FileSystemArtifactStore(made(folder))
    figures: dict[tuple[str, ...], CurveFigure] = {}
    published = 0
    with tempfile.TemporaryDirectory() as tmp:
        for trial, lacking in todo:
            curves = trial_curves(trial, table, objective)
            if not curves:
                continue  # it never trained an epoch: nothing to draw
            names = tuple(sorted(curves))
            figure = figures.get(names) or figures.setdefault(names, CurveFigure(names))
            for path in (Path(tmp, name) for name in sorted(lacking)):
                if path.suffix == ".png":
                    title = f"{study.study_name} #{trial.number} ({trial.state.name.lower()})"
                    figure.draw(curves, title, path)
                else:
                    write_table(curves, path)
                with path.open("rb") as body:
                    artifact_id = have.get(trial._trial_id, {}).get(path.name)
                    upload(study, store, body, path.name, trial._trial_id, artifact_id)
            published += 1
    return published


def _lacking(trial: FrozenTrial, ids: dict[str, str], folder: Path) -> set[str]:
    """Which of ``trial``'s two files the store lacks: no metadata, or no file under it (a
    results folder deleted or moved)."""
    return {
        n for n in (_png(trial), _csv(trial)) if n not in ids or not (folder / ids[n]).is_file()
    }


def attach_file(
    study: optuna.Study,
    path: Path,
    trial: FrozenTrial | None = None,
    results_dir: Path = Path("results"),
) -> str:
    """Attaches ``path`` (a model card, say) to ``trial``, or to the study when ``None``.

    A file of the same name attached before is replaced in place, so attaching again after a
    new export keeps one artifact. Returns its artifact id.
    """
    from optuna.artifacts import FileSystemArtifactStore

    store = FileSystemArtifactStore(made(store_path(results_dir, study.study_name)))
    trial_id = None if trial is None else trial._trial_id
    artifact_id = attached(study).get(trial_id, {}).get(path.name)
    with path.open("rb") as body:
        return upload(study, store, body, path.name, trial_id, artifact_id)


def _png(trial: FrozenTrial) -> str:
    return f"trial-{trial.number:04d}-curves.png"


def _csv(trial: FrozenTrial) -> str:
    return f"trial-{trial.number:04d}-metrics.csv"
