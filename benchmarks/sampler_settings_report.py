"""The report of ``benchmarks/sampler_settings.py``: from its JSON lines to markdown tables.

A run (task, sampler, K, space, seed) that several files hold is taken from the newest file.
Per space of the tables, three tables:

- the median log10 regret of the incumbent after 25, 50, 100, 200 and 400 trials, per table
  and contender (``auto x16``: the project's ``auto`` sampler, 16 at once; ``optuna-tpe``:
  Optuna's TPE one trial at a time, the reference);
- per contender, on how many tables that median is within :data:`WITHIN` decades of
  sequential TPE's at the same trial count (or better); where the runs hold it, the same
  count for the best config evaluated, by its true mean (what the search found, apart from
  which trial a noisy reported value made the incumbent);
- per contender, on how many tables its median is below (better than) that of Optuna's own
  TPE at the same K (``optuna-parallel``: ``TPESampler()`` with Optuna's defaults, as stock
  Ray Tune's ``OptunaSearch`` + ``ConcurrencyLimiter(K)`` and ``study.optimize(n_jobs=K)``
  ask it), when the files hold that peer;
- the simulated wall time to reach sequential TPE's median 100-trial regret, per table: the
  speed-up against sequential TPE's own time to it (the median over seeds of each, the lower
  middle one for an even count; ``never`` when that seed never gets there).

    python benchmarks/sampler_settings.py report                 # every file of the folder
    python benchmarks/sampler_settings.py report results/benchmarks/sampler_settings/x.jsonl
    python benchmarks/sampler_settings.py report --png docs/img/regret   # and the figures

``--png DIR`` also writes regret against trials as one PNG per K
(``benchmarks/sampler_settings_figures.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.sampler_settings import OUT, PEER, SEQUENTIAL
from benchmarks.tables import TASKS

MARKS = (25, 50, 100, 200, 400)
"""Trial counts the regret is reported after."""
WITHIN = 0.25
"""Decades of log10 regret within which a contender counts as level with sequential TPE."""
TARGET_AT = 100
"""The trial count whose median regret of sequential TPE the speed-up is timed to."""
Key = tuple[str, str]  # (task, contender label)


def read(paths: list[Path]) -> list[dict[str, Any]]:
    """Every run of the files, one copy of each (the newest file's, its last line)."""
    runs: dict[tuple, dict[str, Any]] = {}
    for path in sorted(paths, key=lambda p: p.stat().st_mtime):
        for line in path.read_text().splitlines():
            if line.strip():
                run = json.loads(line)
                runs[(run["task"], run["sampler"], run["k"], run["space"], run["seed"])] = run
    if not runs:
        raise SystemExit(f"error: no runs in {', '.join(map(str, paths))}; run the matrix first")
    return list(runs.values())


def label(run: dict[str, Any]) -> str:
    """A contender at its concurrency (``auto x16``); sequential TPE by its name."""
    return SEQUENTIAL if run["sampler"] == SEQUENTIAL else f"{run['sampler']} x{run['k']}"


def _order(labels: set[str]) -> list[str]:
    """Contenders by name, then K; sequential TPE last."""

    def key(who: str) -> tuple[bool, str, int]:
        name, _, k = who.partition(" x")
        return who == SEQUENTIAL, name, int(k or 0)

    return sorted(labels, key=key)


def medians(runs: list[dict[str, Any]], measure: str = "regret") -> dict[Key, dict[int, float]]:
    """Per (task, contender): the median log10 regret after each mark the runs reach, of the
    incumbent (``regret``) or of the best config evaluated (``best_seen``)."""
    curves: dict[Key, list[list[float]]] = defaultdict(list)
    for run in runs:
        curves[(run["task"], label(run))].append(run[measure])
    out: dict[Key, dict[int, float]] = {}
    for key, regrets in curves.items():
        out[key] = {
            m: statistics.median(r[m - 1] for r in regrets)
            for m in MARKS
            if all(len(r) >= m for r in regrets)
        }
    return out


def time_to(run: dict[str, Any], target: float) -> float:
    """Simulated time at which the run's incumbent first reaches ``target`` (``inf``: never)."""
    for regret, end in zip(run["regret"], run["end"], strict=True):
        if regret <= target + 1e-9:
            return float(end)
    return math.inf


def speedups(runs: list[dict[str, Any]], med: dict[Key, dict[int, float]]) -> dict[Key, float]:
    """Per (task, contender): sequential TPE's median time to its own median regret after
    :data:`TARGET_AT` trials, over the contender's median time to it (0: never; the lower
    middle seed for an even count, so that half the seeds reaching it is enough)."""
    times: dict[Key, list[float]] = defaultdict(list)
    for run in runs:
        target = med.get((run["task"], SEQUENTIAL), {}).get(TARGET_AT)
        if target is not None:
            times[(run["task"], label(run))].append(time_to(run, target))
    out = {}
    for (task, who), found in times.items():
        own = statistics.median_low(times[(task, SEQUENTIAL)])
        mine = statistics.median_low(found)
        out[(task, who)] = 0.0 if math.isinf(mine) else own / mine
    return out


def _regret_table(med: dict[Key, dict[int, float]], tasks: list[str], who: list[str]) -> list[str]:
    lines = ["| table | contender | " + " | ".join(f"@{m}" for m in MARKS) + " |"]
    lines.append("|---|---|" + "---:|" * len(MARKS))
    for task in tasks:
        for w in who:
            if (task, w) in med:
                cells = [_num(med[(task, w)].get(m)) for m in MARKS]
                lines.append(f"| {task.split('/')[-1]} | {w} | " + " | ".join(cells) + " |")
    return lines


def _within_table(med: dict[Key, dict[int, float]], tasks: list[str], who: list[str]) -> list[str]:
    lines = [f"| contender (tables within {WITHIN} of {SEQUENTIAL}) | "]
    lines[0] += " | ".join(f"@{m}" for m in MARKS) + " |"
    lines.append("|---|" + "---:|" * len(MARKS))
    for w in [w for w in who if w != SEQUENTIAL]:
        cells = []
        for m in MARKS:
            both = [
                t for t in tasks if m in med.get((t, w), {}) and m in med.get((t, SEQUENTIAL), {})
            ]
            level = sum(med[(t, w)][m] <= med[(t, SEQUENTIAL)][m] + WITHIN for t in both)
            cells.append(f"{level}/{len(both)}" if both else "-")
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    return lines


def _peer_table(med: dict[Key, dict[int, float]], tasks: list[str], who: list[str]) -> list[str]:
    lines = [f"| contender (tables better than {PEER} at its K) | "]
    lines[0] += " | ".join(f"@{m}" for m in MARKS) + " |"
    lines.append("|---|" + "---:|" * len(MARKS))
    for w in [w for w in who if w != SEQUENTIAL and not w.startswith(f"{PEER} ")]:
        peer, cells = f"{PEER} {w.split(' ')[-1]}", []
        for m in MARKS:
            both = [t for t in tasks if m in med.get((t, w), {}) and m in med.get((t, peer), {})]
            better = sum(med[(t, w)][m] < med[(t, peer)][m] for t in both)
            cells.append(f"{better}/{len(both)}" if both else "-")
        if any(c != "-" for c in cells):
            lines.append(f"| {w} | " + " | ".join(cells) + " |")
    return lines


def _speedup_table(speed: dict[Key, float], tasks: list[str], who: list[str]) -> list[str]:
    lines = ["| contender | " + " | ".join(t.split("/")[-1] for t in tasks) + " | median | >= 8x |"]
    lines.append("|---|" + "---:|" * (len(tasks) + 2))
    for w in who:
        mine = [speed[(t, w)] for t in tasks if (t, w) in speed]
        if not mine:
            continue
        cells = [_speed(speed.get((t, w))) for t in tasks]
        fast = sum(s >= 8.0 for s in mine)
        lines.append(
            f"| {w} | " + " | ".join(cells) + f" | {_speed(statistics.median(mine))} "
            f"| {fast}/{len(mine)} |"
        )
    return lines


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _speed(value: float | None) -> str:
    if value is None:
        return "-"
    return "never" if value == 0.0 else f"{value:.1f}x"


def report(runs: list[dict[str, Any]]) -> str:
    """The whole report as markdown, one section per space."""
    out = ["# Samplers at K trials at once, in process (benchmarks/sampler_settings.py)"]
    for kind in sorted({r["space"] for r in runs}):
        mine = [r for r in runs if r["space"] == kind]
        named = {r["task"] for r in mine}
        tasks = [t for t in TASKS if t in named] + sorted(named - set(TASKS))  # then functions
        who = _order({label(r) for r in mine})
        seeds = {w: len({r["seed"] for r in mine if label(r) == w}) for w in who}
        med = medians(mine)
        out += ["", f"## space: {kind}", "", "Seeds: " + ", ".join(f"{w} {seeds[w]}" for w in who)]
        out += ["", "### Median log10 regret of the incumbent after N trials", ""]
        out += _regret_table(med, tasks, who)
        out += ["", f"### Tables within {WITHIN} decades of sequential TPE, same trials", ""]
        out += _within_table(med, tasks, who)
        if all("best_seen" in r for r in mine):
            out += ["", "### The same, by the best config evaluated (its true mean loss)", ""]
            out += _within_table(medians(mine, "best_seen"), tasks, who)
        if any(w.startswith(f"{PEER} ") for w in who):
            out += ["", f"### Tables better than Optuna's own TPE at the same K ({PEER})", ""]
            out += _peer_table(med, tasks, who)
        out += [
            "",
            f"### Simulated wall time to sequential TPE's median {TARGET_AT}-trial regret: "
            "speed-up against sequential TPE's own",
            "",
        ]
        speed = speedups(mine, med)
        out += (
            _speedup_table(speed, tasks, who)
            if speed
            else [f"(no {SEQUENTIAL} run of {TARGET_AT} trials)"]
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    """Prints the report of the given JSON-lines files (default: every file under OUT)."""
    parser = argparse.ArgumentParser(prog="sampler_settings.py report")
    parser.add_argument("files", nargs="*", help=f"JSON-lines files (default: {OUT}/*.jsonl)")
    parser.add_argument("--png", type=Path, help="also write regret-xK.png figures here")
    args = parser.parse_args(argv)
    paths = [Path(f) for f in args.files] or sorted(OUT.glob("*.jsonl"))
    runs = read(paths)
    print(report(runs))
    if args.png:
        from benchmarks.sampler_settings_figures import write

        for path in write(runs, args.png):
            print(f"wrote {path}")
