"""Regret against trials as PNGs: the figures of ``benchmarks/sampler_settings.py``'s runs.

One figure per K at once (``regret-x1.png``, ``regret-x16.png``, ``regret-x64.png``, ...): a
panel per table, the median over seeds of the incumbent's log10 regret after each finished
trial, one line per contender run at that K, and Optuna's sequential TPE (one trial at a
time, :data:`SEQUENTIAL`) dashed on every panel as the reference. A curve stops where its
shortest seed stops, so every point is a median over the same seeds.

    python benchmarks/sampler_settings.py report --png docs/img/regret
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.sampler_settings import PEER, SEQUENTIAL
from benchmarks.tables import TASKS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {"random": "C7", "tpe": "C1", "auto": "C0", PEER: "C3", SEQUENTIAL: "k"}
"""A contender's color, the same in every figure; drawn in this order, so that a line that
coincides with an earlier one shows on top of it (the project's ``tpe`` pins Optuna's own
defaults, so at K > 1 it is :data:`PEER`'s curve; at K = 1 ``auto`` and ``tpe`` are
sequential TPE's), dotted or dashed."""
STYLES = {PEER: ":", SEQUENTIAL: "--"}
Curves = dict[str, dict[str, list[float]]]  # task -> contender -> median after each trial


def curves(runs: list[dict[str, Any]], k: int, measure: str = "regret") -> Curves:
    """Per task and contender run at ``k`` at once (plus sequential TPE, whatever its K): the
    median over seeds of ``measure`` after trial 1, 2, ... as far as every seed reaches.

    Example:
        >>> run = lambda seed, regret: {"task": "t", "sampler": "auto", "k": 16, "seed": seed,
        ...                             "space": "index", "regret": regret}
        >>> curves([run(0, [0.0, -1.0, -2.0]), run(1, [-1.0, -1.0]), run(2, [0.0, -3.0])], 16)
        {'t': {'auto': [0.0, -1.0]}}
    """
    found: dict[tuple[str, str], list[list[float]]] = defaultdict(list)
    for run in runs:
        if run["sampler"] == SEQUENTIAL or (run["k"] == k and not _same_as_sequential(run)):
            found[(run["task"], run["sampler"])].append(run[measure])
    out: Curves = defaultdict(dict)
    for (task, who), per_seed in found.items():
        n = min(len(r) for r in per_seed)
        out[task][who] = [statistics.median(r[i] for r in per_seed) for i in range(n)]
    return dict(out)


def _same_as_sequential(run: dict[str, Any]) -> bool:
    """Optuna's own TPE at K = 1 is sequential TPE under another name: drawn once."""
    return run["sampler"] == PEER and run["k"] == 1


def figure(runs: list[dict[str, Any]], k: int) -> Figure:
    """The figure for ``k`` at once: a panel per table (the order of :data:`TASKS`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = curves(runs, k)
    tasks = [t for t in TASKS if t in data] + sorted(set(data) - set(TASKS))
    cols = min(4, len(tasks))
    rows = -(-len(tasks) // cols)
    fig = Figure(figsize=(3.4 * cols, 2.5 * rows + 0.8), layout="constrained")
    FigureCanvasAgg(fig)
    for i, task in enumerate(tasks):
        ax = fig.add_subplot(rows, cols, i + 1)
        order = list(COLORS)
        for who in sorted(data[task], key=lambda w: (order.index(w) if w in order else -1, w)):
            name = "optuna-tpe, 1 at a time" if who == SEQUENTIAL else f"{who} x{k}"
            ax.plot(
                range(1, len(data[task][who]) + 1),
                data[task][who],
                label=name,
                color=COLORS.get(who),
                linestyle=STYLES.get(who, "-"),
                linewidth=1.6 if who == PEER else 1.2,
            )
        ax.set_title(task.rsplit("/", 1)[-1], fontsize=9)
        ax.tick_params(labelsize=7)
        if i % cols == 0:
            ax.set_ylabel("log10 regret", fontsize=8)
        if i >= len(tasks) - cols:
            ax.set_xlabel("trials finished", fontsize=8)
    handles, names = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=min(5, len(names)), fontsize=8)
    fig.suptitle(f"{k} at once: median log10 regret of the incumbent", fontsize=10)
    return fig


def write(runs: list[dict[str, Any]], folder: Path) -> list[Path]:
    """``regret-xK.png`` in ``folder`` for every K the runs hold besides sequential TPE's."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in sorted({r["k"] for r in runs if r["sampler"] != SEQUENTIAL}):
        path = folder / f"regret-x{k}.png"
        figure(runs, k).savefig(path, dpi=72)
        paths.append(path)
    return paths
