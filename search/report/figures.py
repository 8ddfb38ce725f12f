"""The figures of a study's report: optuna's plots, styled by trial state, as plotly figures.

    optimization-history   each COMPLETE trial's value and the best so far
    intermediate-values    learning curves; COMPLETE solid, PRUNED grey dotted, FAIL red dashed,
                           ASHA's milestones as vertical lines
    param-importances      which parameters mattered (optuna's default evaluator, fANOVA),
                           from :data:`IMPORTANCE_MIN_TRIALS` complete trials on
    parallel-coordinate    parameters against the value
    slice                  the value against each parameter
    timeline               when each trial ran, and its state

The same figures as PNGs: :mod:`search.report.pngs`. A figure that cannot be drawn
(importances with a single COMPLETE trial, say) is replaced by a one-line note in both.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.errors import SpecError, one_line
from search.record.study import stored_spec
from search.specs.derive import asha_milestones

if TYPE_CHECKING:
    import optuna
    import plotly.graph_objects as go

    from search.specs.schema import StudySpec

FIGURES: tuple[tuple[str, str], ...] = (
    ("optimization-history", "Optimization history"),
    ("intermediate-values", "Learning curves (intermediate values)"),
    ("param-importances", "Parameter importances"),
    ("parallel-coordinate", "Parallel coordinates"),
    ("slice", "Slice plots"),
    ("timeline", "Timeline"),
    ("metrics", "Every metric the trials yielded, per epoch"),
    ("pareto-front", "Pareto front"),
)
"""``(id, title)`` of each figure, in page order; the id is the plotly div's and the PNG's name."""

STATE_STYLE = {
    "COMPLETE": {"dash": "solid", "width": 2.0},
    "PRUNED": {"color": "rgba(140, 140, 140, 0.55)", "dash": "dot", "width": 1.2},
    "FAIL": {"color": "rgba(214, 39, 40, 0.85)", "dash": "dash", "width": 1.5},
}
LABEL = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed"}
COMPLETE_COLORS = (
    "#1f77b4",
    "#2ca02c",
    "#9467bd",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#ff7f0e",
)
"""Colors of COMPLETE curves: no red (failed) and no grey (pruned)."""


CURVE_LIMIT = 200
"""The most trials a learning-curve figure draws (a thousand lines show nothing and take
seconds each to draw): every COMPLETE and FAIL one up to half of it, the best first, then
others drawn at random (seeded), and the title says so."""


@contextlib.contextmanager
def uncopied(study: optuna.Study) -> Iterator[optuna.Study]:
    """``study``, whose trials optuna's figures get without a deep copy while this lasts: they
    only read them, and at ten thousand trials the copies cost more than the drawing."""
    storage = study._storage
    original = storage.get_all_trials

    def get_all_trials(study_id: int, deepcopy: bool = True, states: Any = None) -> Any:
        return original(study_id, deepcopy=False, states=states)

    storage.get_all_trials = get_all_trials  # type: ignore[method-assign]
    try:
        yield study
    finally:
        del storage.get_all_trials  # the class's method again


def curve_trials(study: optuna.Study, limit: int = CURVE_LIMIT) -> tuple[set[int], str]:
    """The numbers of the trials a learning-curve figure draws, and a note when not all."""
    import random

    trials = study.get_trials(deepcopy=False)
    if len(trials) <= limit:
        return {t.number for t in trials}, ""
    sign = -1.0 if study.directions[0].name == "MAXIMIZE" else 1.0
    done = [t for t in trials if t.state.name in ("COMPLETE", "FAIL")]
    done.sort(key=lambda t: (t.values is None, sign * (t.values or [0.0])[0], t.number))
    kept = {t.number for t in done[: limit // 2]}
    others = sorted(t.number for t in trials if t.number not in kept)
    kept |= set(random.Random(0).sample(others, limit - len(kept)))
    return kept, f" ({limit} of {len(trials)} trials: the best finished, the rest at random)"


def subset(study: optuna.Study, numbers: set[int]) -> optuna.Study:
    """An in-memory study holding ``study``'s trials ``numbers`` (and its user attributes),
    for a figure of some trials.

    Its trials are ``study``'s own objects, served by its storage's ``get_all_trials`` as
    they are: Optuna's in-memory storage deep-copies each trial it adds and each it returns
    (seconds for a 200-curve figure and a 1,000-trial timeline at 10,000 trials), and a figure
    only reads them."""
    import optuna

    kept = [t for t in study.get_trials(deepcopy=False) if t.number in numbers]
    part = optuna.create_study(study_name=study.study_name, directions=study.directions)

    def get_all_trials(study_id: int, deepcopy: bool = True, states: Any = None) -> Any:
        return [t for t in kept if states is None or t.state in states]

    part._storage.get_all_trials = get_all_trials  # type: ignore[method-assign]
    for key, value in study.user_attrs.items():
        part.set_user_attr(key, value)
    return part


def spec_of(study: optuna.Study) -> StudySpec | None:
    """The spec stored on the study, typed; ``None`` when it has none, or one this version
    does not read (a report shows what it can of such a study)."""
    try:
        return stored_spec(study)
    except SpecError:
        return None


def metric_of(study: optuna.Study) -> str:
    """The name of the study's (primary) objective, ``value`` when its spec is unknown."""
    spec = spec_of(study)
    return spec.primary.metric if spec else "value"


def milestones(study: optuna.Study) -> list[int]:
    """ASHA's milestone epochs below ``max_epochs`` (empty when ASHA was off)."""
    spec = spec_of(study)
    if spec is None or not spec.asha.enabled:
        return []
    asha = spec.asha
    return asha_milestones(
        float(asha.grace_period), float(asha.reduction_factor), spec.budget.max_epochs
    )


def learning_curves(study: optuna.Study) -> go.Figure:
    """optuna's intermediate-values plot, each trace styled by its trial's state, plus FAIL ones."""
    import plotly.graph_objects as go
    from optuna.visualization import plot_intermediate_values

    numbers, note = curve_trials(study)
    study = subset(study, numbers) if note else study
    fig = plot_intermediate_values(study)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    complete = 0
    for trace in fig.data:
        number = int(str(trace.name).removeprefix("Trial"))
        state = trials[number].state.name
        style = dict(STATE_STYLE.get(state, {}))
        if state == "COMPLETE":
            style["color"] = COMPLETE_COLORS[complete % len(COMPLETE_COLORS)]
            complete += 1
        trace.update(
            name=f"#{number} {LABEL.get(state, state.lower())}",
            legendgroup=state,
            showlegend=False,
            line=dict(style),
            marker={
                "symbol": "x" if state == "PRUNED" else "circle",
                "size": 8 if state == "PRUNED" else 5,
                **({"color": style["color"]} if "color" in style else {}),
            },
        )
    for t in trials.values():
        if t.state.name == "FAIL" and t.intermediate_values:
            steps = sorted(t.intermediate_values)
            fig.add_trace(
                go.Scatter(
                    x=steps,
                    y=[t.intermediate_values[s] for s in steps],
                    mode="lines+markers",
                    name=f"#{t.number} failed",
                    legendgroup="FAIL",
                    showlegend=False,
                    line=STATE_STYLE["FAIL"],
                    marker={"symbol": "x", "size": 6},
                )
            )
    shown = {t.state.name for t in trials.values() if t.intermediate_values}
    for state in ("COMPLETE", "PRUNED", "FAIL"):  # one legend entry per state, not per trial
        if state in shown:
            fig.add_trace(
                go.Scatter(
                    x=[None],
                    y=[None],
                    mode="lines",
                    name=LABEL[state],
                    legendgroup=state,
                    line={"color": COMPLETE_COLORS[0], **STATE_STYLE[state]},
                )
            )
    for m in milestones(study):
        fig.add_vline(
            x=m,
            line_dash="dot",
            line_color="rgba(0,0,0,0.25)",
            annotation_text=f"rung {m}",
            annotation_position="top",
        )
    metric = metric_of(study)
    fig.update_layout(
        xaxis_title="epoch",
        yaxis_title=metric,
        showlegend=True,
        title="Learning curves: complete solid, pruned grey dotted, failed red" + note,
    )
    return fig


def plotly_figures(study: optuna.Study) -> dict[str, Any]:
    """Each of :data:`FIGURES` drawn from the study alone as a plotly figure (slices: a list,
    a row of parameters each), or the one-line reason it is missing (``metrics`` comes from
    ``epochs.csv``: :func:`metric_curves`)."""
    from optuna import visualization as vis

    on = primary_target(study)
    makers: dict[str, Callable[[], go.Figure]] = {
        "optimization-history": lambda: vis.plot_optimization_history(study, **on),
        "intermediate-values": (lambda: MO_CURVES) if on else (lambda: learning_curves(study)),
        "param-importances": lambda: (
            too_few_for_importances(study) or vis.plot_param_importances(study, **on)
        ),
        "parallel-coordinate": lambda: vis.plot_parallel_coordinate(study, **on),
        "slice": lambda: slice_rows(study),
        "timeline": lambda: vis.plot_timeline(latest(study)),
        **({"pareto-front": lambda: vis.plot_pareto_front(study)} if on else {}),
    }
    return {name: attempt(make) for name, make in makers.items()}


IMPORTANCE_MIN_TRIALS = 5
"""The complete trials the importance figure needs. fANOVA fits a random forest to the
trials; on fewer it apportions noise (one parameter always gets 1.0), and the figure's one
import, scikit-learn's, would slow the end of every small run."""


def too_few_for_importances(study: optuna.Study) -> str | None:
    """Why the importance figure is not drawn, while the study has fewer than
    :data:`IMPORTANCE_MIN_TRIALS` complete trials (``None``: draw it)."""
    from optuna.trial import TrialState

    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    if done >= IMPORTANCE_MIN_TRIALS:
        return None
    return (
        f"not drawn: {done} complete trial{'s' * (done != 1)} are too few for parameter "
        f"importances ({IMPORTANCE_MIN_TRIALS} at least)"
    )


MO_CURVES = (
    "not drawn: a study of several objectives has no intermediate values (Optuna refuses "
    "them); every metric's curve is in the per-metric figures below"
)
"""What the learning-curve figure says for a multi-objective study."""

TIMELINE_LIMIT = 1000
"""The timeline shows the latest this many trials (a bar each)."""


def latest(study: optuna.Study, limit: int = TIMELINE_LIMIT) -> optuna.Study:
    """``study``, or a copy of its latest ``limit`` trials when it has more."""
    trials = study.get_trials(deepcopy=False)
    return study if len(trials) <= limit else subset(study, {t.number for t in trials[-limit:]})


def primary_target(study: optuna.Study) -> dict[str, Any]:
    """For a multi-objective study, the ``target`` and ``target_name`` that make optuna's
    single-objective figures plot its first objective; nothing for a single objective."""
    if len(study.directions) == 1:
        return {}
    name = study.metric_names[0] if study.metric_names else "objective 0"
    return {"target": lambda t: t.values[0], "target_name": name}


SLICES_PER_ROW = 4


def slice_rows(study: optuna.Study) -> list[go.Figure]:
    """Slice plots, :data:`SLICES_PER_ROW` parameters a figure (optuna makes one wide row)."""
    from optuna.trial import TrialState
    from optuna.visualization import plot_slice

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    names = sorted({name for t in done for name in t.params})  # what optuna's slices plot
    rows = [names[i : i + SLICES_PER_ROW] for i in range(0, len(names), SLICES_PER_ROW)]
    on = primary_target(study)
    figures = (
        [plot_slice(study, params=row, **on) for row in rows] if rows else [plot_slice(study, **on)]
    )
    for figure, row in zip(figures, rows or [[]], strict=False):
        full = len(row) == SLICES_PER_ROW  # a short last row keeps optuna's panel width
        figure.update_layout(width=None if full else 300 * max(1, len(row)) + 200, autosize=full)
    return figures


def attempt(make: Callable[[], Any]) -> Any:
    """``make()``, or the one-line reason it failed. Quietly: optuna's figures log a warning
    each when the study has no completed trial (five lines on the console after a run whose
    trials all failed, which the run's own error line already explains)."""
    optuna_log = logging.getLogger("optuna")
    level = optuna_log.level
    optuna_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return make()
    except Exception as exc:  # too few trials for this figure, say
        return one_line(f"not drawn: {type(exc).__name__}: {exc}", where="first")
    finally:
        optuna_log.setLevel(level)


def metric_curves(table: Path, trials: set[int] | None = None) -> list[Any] | str:
    """One figure per metric of ``epochs.csv`` (:data:`search.record.queries.EPOCHS_FILE`):
    each trial's curve of that metric (of ``trials`` only, when given), so any metric the
    trainable yields can be read."""
    import pandas as pd
    import plotly.graph_objects as go

    if not table.is_file():
        return "no per-epoch table (epochs.csv) beside the report"
    frame = pd.read_csv(table)
    if trials is not None:
        frame = frame[frame["trial"].isin(trials)]
    figures = []
    for metric, rows in frame.groupby("metric", sort=True):
        fig = go.Figure()
        for trial, curve in rows.groupby("trial"):
            curve = curve.sort_values("epoch")
            fig.add_trace(
                go.Scatter(
                    x=curve["epoch"],
                    y=curve["value"],
                    mode="lines+markers",
                    name=f"#{trial}",
                    marker={"size": 4},
                )
            )
        fig.update_layout(title=str(metric), xaxis_title="epoch", yaxis_title=str(metric))
        figures.append(fig)
    return figures or "the per-epoch table is empty"
