"""The report's figures as PNGs (``results/<study>/figures/*.png``), drawn with matplotlib.

``optuna.visualization.matplotlib`` draws them (plotly's own PNG export needs a browser), styled
as the page's plotly figures (:mod:`search.report.figures`). Drawing them is CPU-bound and the
page does not need them, so :func:`start_pngs` draws them in a forked process while the page's
figures are built (at 10,000 trials the drawing takes longer than the page).
"""

from __future__ import annotations

import logging
import multiprocessing
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.record.storage import rdb_backend
from search.report.figures import (
    LABEL,
    MO_CURVES,
    attempt,
    curve_trials,
    latest,
    metric_of,
    milestones,
    primary_target,
    subset,
    too_few_for_importances,
)

if TYPE_CHECKING:
    import optuna

_log = logging.getLogger(__name__)

PNG_TIMELINE_LIMIT = 300
"""The PNG timeline shows the latest this many trials (the page's, more: it can be zoomed)."""


def start_pngs(study: optuna.Study, folder: Path) -> Callable[[], None]:
    """Starts :func:`write_pngs` in a forked process; returns the function that waits for it.

    The child reads what it needs through its own database connections. Where there is no
    ``fork`` (or the child fails), the waiting function draws the PNGs in this process.
    """
    if "fork" not in multiprocessing.get_all_start_methods():
        return lambda: _draw(study, folder)  # at the wait, as the fallback does
    # Imported before the fork: both sides plot importances (scikit-learn's import, slow, paid
    # once), and a child never imports while another thread of a parent might hold the lock.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import optuna.visualization.matplotlib  # noqa: F401

    if too_few_for_importances(study) is None:
        import optuna.importance  # noqa: F401

    child = multiprocessing.get_context("fork").Process(
        target=_child, args=(study, folder), name="search-pngs", daemon=True
    )
    child.start()

    def wait() -> None:
        child.join()
        if child.exitcode != 0:
            _log.warning("the PNG process ended with %s; drawing here", child.exitcode)
            _draw(study, folder)

    return wait


def _child(study: optuna.Study, folder: Path) -> None:
    engine = getattr(rdb_backend(study._storage), "engine", None)
    if engine is not None:  # the parent's connections stay the parent's
        engine.dispose(close=False)
    _draw(study, folder)


def _draw(study: optuna.Study, folder: Path) -> None:
    write_pngs(study, folder)  # the reasons for missing figures are in the page already


def legend(ax: Any, **options: Any) -> None:
    """``ax.legend(**options)`` when ``ax`` holds a labelled artist: matplotlib warns "No
    artists with labels found to put in legend" otherwise (a figure of unlabelled lines).

    Example:
        >>> import matplotlib
        >>> matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt
        >>> fig, ax = plt.subplots()
        >>> _ = ax.axvline(1.0)
        >>> legend(ax); ax.get_legend() is None
        True
        >>> _ = ax.plot([1, 2], label="val_loss")
        >>> legend(ax); ax.get_legend() is not None
        True
        >>> plt.close(fig)
    """
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(**options)


def _png_learning_curves(study: optuna.Study) -> Any:
    from optuna.visualization.matplotlib import plot_intermediate_values

    numbers, note = curve_trials(study)
    study = subset(study, numbers) if note else study
    ax = plot_intermediate_values(study)
    states = {t.number: t.state.name for t in study.get_trials(deepcopy=False)}
    for line in ax.get_lines():
        label = str(line.get_label())
        if not label.startswith("Trial"):
            continue
        state = states.get(int(label.removeprefix("Trial")), "")
        if state == "PRUNED":
            line.set(color="#8c8c8c", linestyle=":", alpha=0.6, marker="x")
        elif state == "COMPLETE":
            line.set(linewidth=2.0, alpha=0.95)
        line.set_label(f"#{label.removeprefix('Trial')} {LABEL.get(state, state.lower())}")
    for t in study.get_trials(deepcopy=False):
        if t.state.name == "FAIL" and t.intermediate_values:
            steps = sorted(t.intermediate_values)
            ax.plot(
                steps,
                [t.intermediate_values[s] for s in steps],
                color="#d62728",
                linestyle="--",
                marker="x",
                label=f"#{t.number} failed",
            )
    for m in milestones(study):
        ax.axvline(m, color="black", alpha=0.2, linestyle=":")
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric_of(study))
    ax.set_title("Learning curves: complete solid, pruned grey dotted, failed red" + note)
    if 1 < len(ax.get_lines()) <= LEGEND_LIMIT:
        legend(
            ax,
            bbox_to_anchor=(1.02, 1),
            loc="upper left",
            fontsize=7,
            ncol=1 + len(ax.get_lines()) // 30,
        )
    return ax


LEGEND_LIMIT = 40
"""Above this many lines a PNG has no legend (it would cover the figure and take seconds)."""


def write_pngs(study: optuna.Study, folder: Path) -> dict[str, Path | str]:
    """Each figure as ``folder/<name>.png`` (matplotlib), or the reason it is missing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from optuna.visualization import matplotlib as vis

    on = primary_target(study)
    makers: dict[str, Callable[[], Any]] = {
        "optimization-history": lambda: vis.plot_optimization_history(study, **on),
        "intermediate-values": (lambda: MO_CURVES) if on else (lambda: _png_learning_curves(study)),
        "param-importances": lambda: (
            too_few_for_importances(study) or vis.plot_param_importances(study, **on)
        ),
        "parallel-coordinate": lambda: vis.plot_parallel_coordinate(study, **on),
        "slice": lambda: vis.plot_slice(study, **on),
        "timeline": lambda: vis.plot_timeline(latest(study, PNG_TIMELINE_LIMIT)),
        **({"pareto-front": lambda: vis.plot_pareto_front(study)} if on else {}),
    }
    folder.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path | str] = {}
    for name, make in makers.items():
        ax = attempt(make)
        if isinstance(ax, str):
            written[name] = ax
            continue
        fig = np.ravel(ax)[0].figure
        fig.set_size_inches(max(fig.get_size_inches()[0], 9), max(fig.get_size_inches()[1], 5))
        path = folder / f"{name}.png"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written[name] = path
    plt.close("all")
    return written
