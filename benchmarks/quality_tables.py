"""The merged report of ``benchmarks/quality.py``: markdown tables and ``quality.png``.

Every slice's CSV under the output folder is read, the runs of one space kept (``index`` for
CSVs written before spaces had a column); a run (task, contender, concurrency, seed) that
several slices hold is taken from the newest file. Regrets are ``log10`` of the
incumbent's true regret (:mod:`benchmarks.quality_report`); aggregated over tasks they are
divided first by the table's median regret of a random config (``norm``: 0 is one random
draw, -1 ten times better), so tables with other scales pool.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.quality_report import (
    CHECKPOINTS,
    TIMES,
    at_times,
    at_trials,
    label,
    summary,
    trials_to_reach,
)
from benchmarks.quality_targets import speedup_lines, speedups, targets
from benchmarks.tables import load

KEY = ["task", "contender", "concurrency", "seed"]


def read(folder: Path, space: str = "index") -> pd.DataFrame:
    """Every slice's rows of one space, one copy of each run (the newest file's)."""
    frames = []
    for path in sorted(folder.glob("*.csv"), key=lambda p: p.stat().st_mtime, reverse=True):
        frame = pd.read_csv(path)
        frame["file"] = path.name
        if "space" not in frame.columns:
            frame["space"] = "index"
        frames.append(frame[frame["space"] == space])
    frames = [f for f in frames if not f.empty]
    if not frames:
        raise SystemExit(f"error: no slice CSV of space {space} under {folder}; run a slice first")
    rows = pd.concat(frames, ignore_index=True)
    first = rows.groupby(KEY)["file"].transform("first")
    rows = rows[rows["file"] == first].copy()
    rows["who"] = [label(c, k) for c, k in zip(rows["contender"], rows["concurrency"], strict=True)]
    return rows


def _order(labels: list[str]) -> list[str]:
    rank = {"ours": 0, "stock": 1, "optuna-jobs": 2, "optuna-tpe": 3, "random": 4}

    def key(who: str) -> tuple[int, str, int]:
        name, _, k = who.partition(" x")
        return rank.get(name, rank.get(name.split("-")[0], 0)), name, int(k or 0)

    return sorted(set(labels), key=key)


def _who(frame: pd.DataFrame) -> pd.Series:
    return pd.Series(
        [label(c, k) for c, k in zip(frame["contender"], frame["concurrency"], strict=True)],
        index=frame.index,
    )


def _table(frame: pd.DataFrame, columns: tuple, head: str) -> list[str]:
    """``median [q1, q3]`` of each column per contender, with the number of seeds."""
    frame = frame.assign(who=_who(frame))
    lines = [f"| {head} | runs | " + " | ".join(str(c) for c in columns) + " |"]
    lines.append("|---|---:|" + "---:|" * len(columns))
    for who in _order(list(frame["who"])):
        mine = frame[frame["who"] == who]
        cells = [summary(mine[c]) for c in columns]
        lines.append(f"| {who} | {len(mine)} | " + " | ".join(cells) + " |")
    return lines


def _count(trials: pd.Series, ran: int) -> str:
    """The median of trials to reach a target, ``>ran`` when over half never reached it."""
    if trials.empty:
        return "-"
    med = float(np.median(trials.clip(upper=ran + 1)))
    return f">{ran}" if med > ran else f"{med:.0f}"


def _reach(frame: pd.DataFrame, at: pd.DataFrame, source: str, n: int) -> list[str]:
    """Trials each contender needs to reach ``source``'s median regret after ``n`` trials."""
    base = at[(at["contender"] == source)]
    targets = base.groupby("task")[n].median().dropna().to_dict()
    reach = trials_to_reach(frame, targets)
    if reach.empty:
        return [f"(no {source} runs of {n} trials)"]
    reach = reach.assign(who=_who(reach))
    tasks = sorted(reach["task"].unique())
    lines = ["| contender | " + " | ".join(t.split("/")[1] for t in tasks) + " |"]
    lines.append("|---|" + "---:|" * len(tasks))
    for who in _order(list(reach["who"])):
        cells = []
        for task in tasks:
            mine = reach[(reach["who"] == who) & (reach["task"] == task)]
            cells.append(_count(mine["n"], int(mine["ran"].max()) if len(mine) else 0))
        lines.append(f"| {who} | " + " | ".join(cells) + " |")
    return lines


def _medians(at: pd.DataFrame, n: int) -> pd.DataFrame:
    """Median regret after ``n`` trials, tasks x contenders."""
    at = at.assign(who=_who(at))
    return at.groupby(["task", "who"])[n].median().unstack("who")


def _wins(at: pd.DataFrame, n: int = 100) -> list[str]:
    """Per contender of ours: on how many tasks its median after ``n`` trials is at most
    stock Ray Tune's and Optuna ``n_jobs``'s (same concurrency), random's and sequential
    TPE's."""
    med = _medians(at, n)
    head = "<= stock | <= optuna-jobs | <= random | <= optuna-tpe"
    lines = [f"| after {n} trials | {head} | tasks |", "|---|---:|---:|---:|---:|---:|"]
    for who in [w for w in _order(list(med.columns)) if w.startswith("ours")]:
        k = who.split(" x")[1]
        cells = []
        for other in (f"stock x{k}", f"optuna-jobs x{k}", "random", "optuna-tpe"):
            if other not in med.columns:
                cells.append("-")
                continue
            both = med[[who, other]].dropna()
            cells.append(f"{int((both[who] <= both[other] + 1e-12).sum())}/{len(both)}")
        lines.append(f"| {who} | " + " | ".join(cells) + f" | {med[who].notna().sum()} |")
    return lines


def figure(frame: pd.DataFrame, path: Path) -> None:
    """Median log10 regret against trials, one panel per task and one pooled (normalized)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted(frame["task"].unique())
    cols = min(4, len(tasks) + 1)
    rows_ = math.ceil((len(tasks) + 1) / cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(4 * cols, 3 * rows_), squeeze=False)
    panels = [(t, frame[frame["task"] == t], "log_best") for t in tasks]
    panels.append(("all tasks (normalized)", frame, "norm_log_best"))
    for ax, (title, part, column) in zip(axes.flat, panels, strict=False):
        for who in _order(list(part["who"])):
            curve = part[part["who"] == who].groupby("trial")[column].median()
            ax.plot(curve.index, curve.to_numpy(), label=who)
        ax.set_title(title, fontsize=9)
        ax.set_xscale("log")
        ax.set_xlabel("trials")
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    axes.flat[0].set_ylabel("median log10 regret")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(folder: Path, space: str = "index") -> str:
    """The whole report of one space as markdown; writes ``quality.png`` beside the CSVs
    (``quality-choice.png`` for the ``choice`` space)."""
    frame = read(folder, space)
    tasks = sorted(frame["task"].unique())
    tables = {t: load(t) for t in tasks}
    cost = {t: float(table.cost.mean()) for t, table in tables.items()}
    at = at_trials(frame)
    out = ["# Search quality on tabular benchmarks", ""]
    codes = ", ".join(sorted(frame["code"].astype(str).unique()))
    scales = ", ".join(str(s) for s in sorted(frame["scale"].unique()))
    out.append(f"Tasks: {len(tasks)}; space {space}; code at {codes}; scale {scales}.")
    out += ["", "## log10 regret after N trials, per task: median [q1, q3] over seeds"]
    for task in tasks:
        out += ["", f"### {task}", ""] + _table(at[at["task"] == task], CHECKPOINTS, "contender")
    norm = at_trials(frame, "norm_log_best")
    out += ["", "## All tasks: log10 regret / the table's median random regret", ""]
    out += _table(norm, CHECKPOINTS, "contender (pooled over tasks and seeds)")
    times = at_times(frame, cost)
    out += ["", "## Against simulated time (m x the table's mean training time), all tasks", ""]
    out += _table(times, TIMES, "normalized log10 regret at m =")
    out += ["", "## Trials to reach random search's 200-trial regret (median over seeds)", ""]
    out += _reach(frame, at, "random", 200)
    out += ["", "## Trials to reach sequential TPE's 50-trial regret (median over seeds)", ""]
    out += _reach(frame, at, "optuna-tpe", 50)
    speed = speedups(frame, at, {t: table.floor for t, table in tables.items()})
    out += ["", "## Simulated wall time to sequential TPE's median 100-trial regret"]
    out += ["", "Speed-up against sequential TPE's own time (median over seeds)", ""]
    out += speedup_lines(speed, _order(list(speed.columns)) if not speed.empty else [])
    out += ["", "## Wins per task (median regret after 100 trials)", ""] + _wins(at)
    medians = {n: _medians(at, n) for n in (100, 400)}
    out += ["", "## Targets (issue 33)", ""] + targets(at, speed, medians)
    png = folder / ("quality.png" if space == "index" else f"quality-{space}.png")
    figure(frame, png)
    out += ["", f"Figure: {png}"]
    return "\n".join(out)
