"""Rows and reports of ``benchmarks/quality.py``: from trials to regret curves, CSV and tables.

One CSV row per trial (:func:`rows`). ``best_regret`` is the true regret (mean over the
table's seeds, against the best mean) of the incumbent after this trial: the trial with the
best *reported* value among the first ``trial`` ones, as the user would pick it, not the best
config the search happened to try. ``sim_end_s`` replays the trials at the slice's
concurrency on the recorded training times (unscaled): each trial, in order of creation,
starts on the first free worker; it ends at ``sim_end_s``. ``wall_end_s`` is the measured end
relative to the first trial's start (scaled sleeps plus orchestration).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from benchmarks.quality_runs import Trial
from benchmarks.tables import Table, log_regret

CHECKPOINTS = (25, 50, 100, 200, 400)
"""Trials after which the regret is reported."""
TIMES = (2, 5, 10, 25, 50, 100)
"""Simulated times at which the regret is reported, in multiples of the table's mean cost."""


def simulate(costs: Sequence[float], concurrency: int) -> list[float]:
    """When each trial ends if they start in order, each on the first free of ``concurrency``
    workers, and take ``costs`` seconds.

    >>> simulate([3.0, 1.0, 1.0, 5.0], 2)
    [3.0, 1.0, 2.0, 8.0]
    """
    free = [0.0] * concurrency
    ends = []
    for cost in costs:
        start = heapq.heappop(free)
        ends.append(start + cost)
        heapq.heappush(free, start + cost)
    return ends


def rows(table: Table, trials: list[Trial], meta: dict[str, Any], seed: int) -> list[dict]:
    """One row per trial, in order of creation, with ``meta`` (task, contender, concurrency,
    mode, ...) in each.

    ``seed`` is the run's seed: trial ``n`` drew the table's seed that ``seed + n`` picks;
    a reported value that is not that draw's raises ``ValueError``."""
    sign = -1.0 if table.mode == "max" else 1.0
    draws = [table.draw(table.row(t.params), seed + t.number) for t in trials]
    for t, (value, _) in zip(trials, draws, strict=True):
        if not math.isclose(value, t.value, rel_tol=1e-9, abs_tol=1e-12):
            raise ValueError(f"trial {t.number} reported {t.value}, the table says {value}")
    costs = [cost for _, cost in draws]
    best, out = math.inf, []
    ends = simulate(costs, int(meta["concurrency"]))
    first = min((t.start for t in trials), default=0.0)
    best_regret = math.nan
    for position, (t, cost, end) in enumerate(zip(trials, costs, ends, strict=True), 1):
        row = table.row(t.params)
        regret = float(table.regret[row])
        if sign * t.value < best:
            best, best_regret = sign * t.value, regret
        out.append(
            {
                **meta,
                "seed": seed,
                "trial": position,
                "number": t.number,
                "row": row,
                "value": t.value,
                "regret": regret,
                "norm_log_regret": log_regret(table, regret) - math.log10(table.typical),
                "best_regret": best_regret,
                "log_best": log_regret(table, best_regret),
                "norm_log_best": log_regret(table, best_regret) - math.log10(table.typical),
                "cost": cost,
                "sim_end_s": end,
                "wall_end_s": t.end - first,
            }
        )
    return out


def _runs(frame: pd.DataFrame) -> list[tuple[Any, pd.DataFrame]]:
    keys = ["task", "contender", "concurrency", "seed"]
    return list(frame.sort_values(keys + ["trial"]).groupby(keys, sort=False))


def at_trials(frame: pd.DataFrame, column: str = "log_best") -> pd.DataFrame:
    """Per run: ``column`` after each of :data:`CHECKPOINTS` trials (NaN past the run)."""
    out = []
    for (task, who, k, seed), run in _runs(frame):
        values = run[column].to_numpy()
        row = {"task": task, "contender": who, "concurrency": k, "seed": seed}
        for n in CHECKPOINTS:
            row[n] = values[n - 1] if len(values) >= n else math.nan
        out.append(row)
    return pd.DataFrame(out)


def at_times(frame: pd.DataFrame, mean_cost: dict[str, float]) -> pd.DataFrame:
    """Per run: the normalized log regret of the incumbent among the trials that ended, in
    simulated time, by ``m`` times the table's mean cost, for ``m`` in :data:`TIMES`."""
    out = []
    for (task, who, k, seed), run in _runs(frame):
        row = {"task": task, "contender": who, "concurrency": k, "seed": seed}
        done = run.sort_values("sim_end_s")
        sign = -1.0 if done["mode"].iloc[0] == "max" else 1.0
        for m in TIMES:
            ended = done[done["sim_end_s"] <= m * mean_cost[task]]
            if ended.empty:
                row[m] = math.nan
                continue
            best = ended.iloc[int((sign * ended["value"]).to_numpy().argmin())]
            row[m] = best["norm_log_regret"]
        out.append(row)
    return pd.DataFrame(out)


def trials_to_reach(frame: pd.DataFrame, targets: dict[str, float]) -> pd.DataFrame:
    """Per run: the first trial whose incumbent's log regret is at most the task's target
    (``inf`` when the run never gets there) and how many trials it ran."""
    out = []
    for (task, who, k, seed), run in _runs(frame):
        if task not in targets:
            continue
        hit = run[run["log_best"] <= targets[task] + 1e-12]["trial"]
        n = float(hit.iloc[0]) if len(hit) else math.inf
        row = {"task": task, "contender": who, "concurrency": k, "seed": seed, "n": n}
        out.append({**row, "ran": int(run["trial"].max())})
    return pd.DataFrame(out)


def summary(values: pd.Series, digits: int = 2) -> str:
    """``median [q1, q3]`` of the values that are not NaN (``-`` when none are)."""
    values = values.dropna()
    if values.empty:
        return "-"
    q1, med, q3 = (values.quantile(q) for q in (0.25, 0.5, 0.75))
    return f"{med:.{digits}f} [{q1:.{digits}f}, {q3:.{digits}f}]"


def label(contender: str, concurrency: int) -> str:
    """A contender at its concurrency, as the tables name it (``ours-tpe x16``)."""
    return contender if contender in ("optuna-tpe", "random") else f"{contender} x{concurrency}"
