"""The merged report of ``benchmarks/quality.py``: markdown tables and ``quality.png``.

Every slice's CSV under the output folder is read; a run (task, contender, concurrency, seed)
that several slices hold is taken from the newest file. Regrets are ``log10`` of the
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
from benchmarks.tables import load

KEY = ["task", "contender", "concurrency", "seed"]


def read(folder: Path) -> pd.DataFrame:
    """Every slice's rows, one copy of each run (the newest file's)."""
    frames = []
    for path in sorted(folder.glob("*.csv"), key=lambda p: p.stat().st_mtime, reverse=True):
        frame = pd.read_csv(path)
        frame["file"] = path.name
        frames.append(frame)
    if not frames:
        raise SystemExit(f"error: no slice CSV under {folder}; run a slice first")
    rows = pd.concat(frames, ignore_index=True)
    first = rows.groupby(KEY)["file"].transform("first")
    rows = rows[rows["file"] == first].copy()
    rows["who"] = [label(c, k) for c, k in zip(rows["contender"], rows["concurrency"], strict=True)]
    return rows


def _order(labels: list[str]) -> list[str]:
    rank = {"ours": 0, "stock": 1, "optuna-tpe": 2, "random": 3}
    return sorted(set(labels), key=lambda w: (rank.get(w.split(" ")[0].split("-")[0], 0), w))


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
    stock Ray Tune's (same concurrency), random's and sequential TPE's."""
    med = _medians(at, n)
    lines = [f"| after {n} trials | <= stock | <= random | <= optuna-tpe | tasks |"]
    lines.append("|---|---:|---:|---:|---:|")
    for who in [w for w in _order(list(med.columns)) if w.startswith("ours")]:
        stock = f"stock x{who.split(' x')[1]}"
        cells = []
        for other in (stock, "random", "optuna-tpe"):
            if other not in med.columns:
                cells.append("-")
                continue
            both = med[[who, other]].dropna()
            cells.append(f"{int((both[who] <= both[other] + 1e-12).sum())}/{len(both)}")
        lines.append(f"| {who} | " + " | ".join(cells) + f" | {med[who].notna().sum()} |")
    return lines


def _targets(frame: pd.DataFrame, at: pd.DataFrame) -> list[str]:
    """Issue 22's targets for each of ours: after 100 trials at most stock Ray Tune's median
    regret on 9 of 12 tasks and random's on all; sequential TPE's 50-trial regret reached
    within 65 trials (median over seeds, per task)."""
    med = _medians(at, 100)
    seq = at[at["contender"] == "optuna-tpe"].groupby("task")[50].median().dropna()
    reach = trials_to_reach(frame, seq.to_dict())
    reach = reach.assign(who=_who(reach)) if not reach.empty else reach
    lines = []
    for who in [w for w in _order(list(med.columns)) if w.startswith("ours")]:
        stock = f"stock x{who.split(' x')[1]}"
        for other, need in ((stock, "9 of 12"), ("random", "all 12")):
            if other in med.columns:
                both = med[[who, other]].dropna()
                wins = int((both[who] <= both[other] + 1e-12).sum())
                lines.append(f"- {who}: <= {other} after 100 trials on {wins} of {len(both)} tasks")
                lines[-1] += f" (target: {need})"
        if not reach.empty:
            mine = reach[reach["who"] == who]
            per_task = mine.groupby("task")["n"].median()
            ok = int((per_task <= 65).sum())
            lines.append(
                f"- {who}: reaches sequential TPE's 50-trial regret within 65 trials on {ok} of "
                f"{len(per_task)} tasks (median over tasks "
                f"{_count(per_task, int(mine['ran'].max()))} trials; target: <= 65)"
            )
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


def report(folder: Path) -> str:
    """The whole report as markdown; writes ``quality.png`` beside the CSVs."""
    frame = read(folder)
    tasks = sorted(frame["task"].unique())
    cost = {t: float(load(t).cost.mean()) for t in tasks}
    at = at_trials(frame)
    out = ["# Search quality on tabular benchmarks", ""]
    codes = ", ".join(sorted(frame["code"].astype(str).unique()))
    scales = ", ".join(str(s) for s in sorted(frame["scale"].unique()))
    out.append(f"Tasks: {len(tasks)}; code at {codes}; scale {scales}.")
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
    out += ["", "## Wins per task (median regret after 100 trials)", ""] + _wins(at)
    out += ["", "## Targets (issue 22)", ""] + _targets(frame, at)
    figure(frame, folder / "quality.png")
    out += ["", f"Figure: {folder / 'quality.png'}"]
    return "\n".join(out)
