"""Issue 33's measures and targets for the report of ``benchmarks/quality.py``.

The speed-up: per table, sequential TPE's median log10 regret after :data:`TARGET_AT` trials
is the target; each run's time to it is the simulated time (``sim_end_s``, the trials
replayed on their recorded training times at the run's concurrency) at which the incumbent
among the trials that ended by then (best reported value) first has a log10 regret at most
the target. A contender's speed-up is sequential TPE's median time over its own (median over
seeds, the lower middle one for an even count; ``never`` when that seed never gets there).

The targets, for each of this project's contenders at the concurrency it ran:

- 16 at once, 100 trials: within :data:`WITHIN` decades of sequential TPE's median regret on
  at least 10 of 12 tables, and at most stock Ray Tune's and Optuna ``n_jobs=16``'s on at
  least 9 of 12;
- 64 at once, 400 trials: within :data:`WITHIN` of sequential TPE's on at least 8 of 12;
- 16 at once: at least 8x sequential TPE's speed to its 100-trial regret;
- one at a time: no table worse than ``ours-tpe`` (the default before ``auto``) by more than
  0.1 decades after 100 trials.
"""

from __future__ import annotations

import math
import statistics

import pandas as pd

from benchmarks.quality_report import _runs, label

TARGET_AT = 100
"""The trial count whose median regret of sequential TPE the speed-up is timed to."""
WITHIN = 0.25
"""Decades within which a contender counts as level with sequential TPE."""
SEQUENTIAL = "optuna-tpe"


def time_to_reach(
    frame: pd.DataFrame, targets: dict[str, float], floors: dict[str, float]
) -> pd.DataFrame:
    """Per run: the simulated time its incumbent first reaches the task's target log10
    regret (``inf``: never); ``floors`` are the tables' regret floors."""
    out = []
    for (task, who, k, seed), run in _runs(frame):
        if task not in targets:
            continue
        done = run.sort_values("sim_end_s", kind="stable")
        sign = -1.0 if done["mode"].iloc[0] == "max" else 1.0
        best, when = math.inf, math.inf
        for value, regret, end in zip(
            sign * done["value"], done["regret"], done["sim_end_s"], strict=True
        ):
            if value < best:
                best, incumbent = value, regret
                if math.log10(max(incumbent, floors[task])) <= targets[task] + 1e-9:
                    when = float(end)
                    break
        out.append({"task": task, "contender": who, "concurrency": k, "seed": seed, "t": when})
    return pd.DataFrame(out)


def speedups(frame: pd.DataFrame, at: pd.DataFrame, floors: dict[str, float]) -> pd.DataFrame:
    """Tasks x contenders: sequential TPE's median time to its median regret after
    :data:`TARGET_AT` trials over the contender's (0.0: never)."""
    seq = at[at["contender"] == SEQUENTIAL]
    targets = seq.groupby("task")[TARGET_AT].median().dropna().to_dict()
    times = time_to_reach(frame, targets, floors)
    if times.empty:
        return pd.DataFrame()
    times["who"] = [
        label(c, k) for c, k in zip(times["contender"], times["concurrency"], strict=True)
    ]
    medians = times.groupby(["task", "who"])["t"].agg(lambda t: statistics.median_low(list(t)))
    table = medians.unstack("who")
    if SEQUENTIAL not in table.columns:
        return pd.DataFrame()
    ratio = table.rdiv(table[SEQUENTIAL], axis=0)
    return ratio.where(~table.isin([math.inf]), 0.0)


def speedup_lines(speed: pd.DataFrame, order: list[str]) -> list[str]:
    """The speed-up table: contenders x tasks, with the median over tasks."""
    if speed.empty:
        return [f"(no {SEQUENTIAL} runs of {TARGET_AT} trials)"]
    tasks = list(speed.index)
    lines = ["| contender | " + " | ".join(t.split("/")[1] for t in tasks) + " | median |"]
    lines.append("|---|" + "---:|" * (len(tasks) + 1))
    for who in [w for w in order if w in speed.columns]:
        column = speed[who].dropna()
        cells = [_speed(speed.at[t, who]) for t in tasks]
        median = _speed(float(column.median())) if len(column) else "-"
        lines.append(f"| {who} | " + " | ".join(cells) + f" | {median} |")
    return lines


def _speed(value: float) -> str:
    if value != value:
        return "-"
    return "never" if value == 0.0 else f"{value:.1f}x"


def _count(med: pd.DataFrame, who: str, other: str, n: int, slack: float) -> tuple[int, int]:
    """On how many tasks ``who``'s median after ``n`` trials is at most ``other``'s plus
    ``slack``, of the tasks both ran."""
    if who not in med.columns or other not in med.columns:
        return 0, 0
    both = med[[who, other]].dropna()
    return int((both[who] <= both[other] + slack + 1e-12).sum()), len(both)


def targets(at: pd.DataFrame, speed: pd.DataFrame, medians: dict[int, pd.DataFrame]) -> list[str]:
    """Issue 33's targets (the module's text) for each of ours, as lines of markdown;
    ``medians`` maps a trial count to its tasks x contenders median regrets."""
    med100, lines = medians[100], []
    ours = sorted(w for w in med100.columns if w.startswith("ours"))
    for who in ours:
        k = int(who.split(" x")[1])
        if k == 16:
            level, n = _count(med100, who, SEQUENTIAL, 100, WITHIN)
            lines.append(f"- {who}: within {WITHIN} of {SEQUENTIAL} after 100 trials on {level}")
            lines[-1] += f" of {n} tables (target: 10 of 12)"
            for other in (f"stock x{k}", f"optuna-jobs x{k}"):
                wins, n = _count(med100, who, other, 100, 0.0)
                lines.append(f"- {who}: <= {other} after 100 trials on {wins} of {n} tables")
                lines[-1] += " (target: 9 of 12)"
            if not speed.empty and who in speed.columns:
                column = speed[who].dropna()
                fast = int((column >= 8.0).sum())
                lines.append(
                    f"- {who}: speed-up to {SEQUENTIAL}'s {TARGET_AT}-trial regret, median over "
                    f"tables {_speed(float(column.median()))}, >= 8x on {fast} of {len(column)}"
                    " (target: >= 8x)"
                )
        if k == 64 and 400 in medians:
            level, n = _count(medians[400], who, SEQUENTIAL, 400, WITHIN)
            lines.append(f"- {who}: within {WITHIN} of {SEQUENTIAL} after 400 trials on {level}")
            lines[-1] += f" of {n} tables (target: 8 of 12)"
        if k == 1 and who != "ours-tpe x1" and "ours-tpe x1" in med100.columns:
            both = med100[[who, "ours-tpe x1"]].dropna()
            worse = both[who] - both["ours-tpe x1"]
            ok = int((worse <= 0.1 + 1e-12).sum())
            lines.append(
                f"- {who}: no worse than ours-tpe x1 + 0.1 after 100 trials on {ok} of "
                f"{len(both)} tables (worst {worse.max():+.2f}; target: all)"
            )
    return lines or ["(no target applies to the contenders and concurrencies run)"]
