"""Reads the multi-fidelity benchmark's studies back and measures the compute to reach a regret.

For each finished study (one scheduler, one seed), from its Optuna storage: the trials in
creation order, the epochs each trained (its intermediate values), its cost (simulated or
measured seconds), and its regret when it is COMPLETE. Compute is counted in creation order:
after trial ``k`` the study has spent the epochs (seconds) of trials ``0..k``, and its regret is
the best of the COMPLETE ones among them. A scheduler reaches a target when that best regret
first falls to the target or below; the compute it had spent then is what it needed.

The target of each seed is the final regret of the no-pruning study with that seed.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna

ScoreFn = Callable[[optuna.trial.FrozenTrial], float]
"""A COMPLETE trial's score: lower is better."""
SecondsFn = Callable[[optuna.trial.FrozenTrial, int], float]
"""What a trial that trained the given number of epochs cost, in seconds."""

REFERENCE = "none"
"""The scheduler whose final regret is the target and whose compute is the yardstick."""


@dataclass(frozen=True)
class Step:
    """One trial of a study, with the study's compute and best regret just after it."""

    trial: int
    state: str
    epochs: int
    seconds: float
    score: float | None
    """Lower is better: the true regret (Hartmann) or minus the final objective (CNN)."""
    cum_epochs: int
    cum_seconds: float
    best: float


def read_steps(storage: Any, study: str, score_of: ScoreFn, seconds_of: SecondsFn) -> list[Step]:
    """The study's trials in creation order, with cumulative compute and best regret so far."""
    trials = optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
    steps: list[Step] = []
    cum_epochs, cum_seconds, best = 0, 0.0, math.inf
    for trial in sorted(trials, key=lambda t: t.number):
        epochs = len(trial.intermediate_values) or int(trial.user_attrs.get("epochs", 0))
        seconds = seconds_of(trial, epochs)
        complete = trial.state == optuna.trial.TrialState.COMPLETE
        score = score_of(trial) if complete else None
        cum_epochs += epochs
        cum_seconds += seconds
        if score is not None:
            best = min(best, score)
        state = trial.state.name
        steps.append(
            Step(trial.number, state, epochs, seconds, score, cum_epochs, cum_seconds, best)
        )
    return steps


def reach(steps: Sequence[Step], target: float) -> Step | None:
    """The first step at which the best regret is at most ``target`` (``None``: never)."""
    return next((s for s in steps if s.best <= target + 1e-12), None)


@dataclass(frozen=True)
class Row:
    """One study's outcome against its seed's target."""

    task: str
    scheduler: str
    seed: int
    trials: int
    complete: int
    epochs: int
    seconds: float
    wall_s: float
    final_regret: float
    target: float
    reach_epochs: float
    reach_seconds: float
    ratio_epochs: float
    """``reach_epochs`` over the no-pruning study's total epochs (``inf``: never reached)."""
    ratio_seconds: float


def rows_for(
    task: str,
    studies: dict[tuple[str, int], list[Step]],
    walls: dict[tuple[str, int], float],
    offset: float = 0.0,
) -> list[Row]:
    """One :class:`Row` per study of ``task``; ``studies`` maps (scheduler, seed) to steps.

    ``offset`` is subtracted from the scores to make them regrets (the CNN's: minus the best
    val_accuracy any run of the task reached; 0 for Hartmann, whose scores are regrets).
    """
    rows = []
    for (scheduler, seed), steps in sorted(studies.items()):
        reference = studies.get((REFERENCE, seed))
        if not reference or not steps:
            continue
        target = reference[-1].best
        hit = reach(steps, target)
        total_e, total_s = reference[-1].cum_epochs, reference[-1].cum_seconds
        rows.append(
            Row(
                task=task,
                scheduler=scheduler,
                seed=seed,
                trials=len(steps),
                complete=sum(s.state == "COMPLETE" for s in steps),
                epochs=steps[-1].cum_epochs,
                seconds=round(steps[-1].cum_seconds, 2),
                wall_s=round(walls.get((scheduler, seed), math.nan), 1),
                final_regret=steps[-1].best - offset,
                target=target - offset,
                reach_epochs=hit.cum_epochs if hit else math.inf,
                reach_seconds=round(hit.cum_seconds, 2) if hit else math.inf,
                ratio_epochs=(hit.cum_epochs / total_e) if hit else math.inf,
                ratio_seconds=(hit.cum_seconds / total_s) if hit else math.inf,
            )
        )
    return rows


def rung_correlation(storage: Any, study: str, epochs: Sequence[int]) -> dict[int, float]:
    """Spearman's rank correlation of each epoch's value with the final one, over the study's
    COMPLETE trials: how well an early rung predicts the end (1: perfectly, 0: not at all)."""
    from scipy.stats import spearmanr

    trials = optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
    curves = [t.intermediate_values for t in trials if t.state.name == "COMPLETE"]
    out = {}
    for epoch in epochs:
        pairs = [(c[epoch], c[max(c)]) for c in curves if epoch in c and max(c) > epoch]
        if len(pairs) >= 3:
            early, final = zip(*pairs, strict=True)
            out[epoch] = float(spearmanr(early, final)[0])
    return out


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def _fmt(value: float, digits: int = 2) -> str:
    if math.isinf(value):
        return "never"
    return f"{value:.{digits}f}" if not float(value).is_integer() else f"{value:.0f}"


def table(rows: Sequence[Row], unit: str) -> str:
    """A markdown table: per task and scheduler, medians over seeds."""
    lines = [
        f"| task | scheduler | seeds | trials | epochs | {unit} | final regret | reached "
        f"target | epochs to target | {unit} to target | ratio (epochs) | ratio ({unit}) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r.task, r.scheduler) for r in rows}, key=lambda k: (k[0], _rank(k[1])))
    for task, scheduler in keys:
        group = [r for r in rows if (r.task, r.scheduler) == (task, scheduler)]
        reached = sum(not math.isinf(r.reach_epochs) for r in group)
        cells = [
            task,
            scheduler,
            str(len(group)),
            _fmt(_median([r.trials for r in group])),
            _fmt(_median([r.epochs for r in group])),
            _fmt(_median([r.seconds for r in group]), 1),
            _fmt(_median([r.final_regret for r in group]), 4),
            f"{reached}/{len(group)}",
            _fmt(_median([r.reach_epochs for r in group])),
            _fmt(_median([r.reach_seconds for r in group]), 1),
            _fmt(_median([r.ratio_epochs for r in group]), 3),
            _fmt(_median([r.ratio_seconds for r in group]), 3),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def at_compute(steps: Sequence[Step], epochs: float) -> float:
    """The best regret of the COMPLETE trials among those the study had run when it had
    spent ``epochs`` (``inf``: none yet)."""
    return min((s.best for s in steps if s.cum_epochs <= epochs), default=math.inf)


def across_table(per_k: dict[int, dict[tuple[str, int], list[Step]]], offset: float) -> str:
    """Per scheduler and concurrency, medians over seeds: epochs, final regret, and the
    regret at the epochs every concurrency's study of that seed spent (the fewest)."""
    lines = [
        "| scheduler | at once | seeds | epochs | final regret | common epochs | regret there |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    keys = {key for studies in per_k.values() for key in studies}
    for scheduler in sorted({k[0] for k in keys}, key=_rank):
        seeds = sorted({seed for s, seed in keys if s == scheduler})
        common = {}
        for seed in seeds:
            runs = [st[(scheduler, seed)] for st in per_k.values() if (scheduler, seed) in st]
            if len(runs) == len(per_k):  # every concurrency ran this seed
                common[seed] = min(steps[-1].cum_epochs for steps in runs)
        for k, studies in sorted(per_k.items()):
            mine = {
                seed: studies[(scheduler, seed)] for seed in seeds if (scheduler, seed) in studies
            }
            if not mine:
                continue
            there = [
                at_compute(mine[seed], e) - offset for seed, e in common.items() if seed in mine
            ]
            cells = [
                scheduler,
                str(k),
                str(len(mine)),
                _fmt(_median([steps[-1].cum_epochs for steps in mine.values()])),
                _fmt(_median([steps[-1].best - offset for steps in mine.values()]), 4),
                _fmt(_median(list(common.values()))),
                _fmt(_median(there), 4),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _rank(scheduler: str) -> int:
    order = ("none", "asha", "hyperband")
    return order.index(scheduler) if scheduler in order else len(order)


def write_csv(path: Path, records: Sequence[Any]) -> None:
    """Dataclass records as a CSV file (nothing written when there are none)."""
    if not records:
        return
    dicts = [asdict(r) for r in records]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(dicts[0]))
        writer.writeheader()
        writer.writerows(dicts)


def plot(
    path: Path, task: str, studies: dict[tuple[str, int], list[Step]], offset: float = 0.0
) -> None:
    """Best regret against cumulative epochs, one line per study, a colour per scheduler."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    colours = {"none": "tab:gray", "asha": "tab:blue", "hyperband": "tab:orange"}
    labelled: set[str] = set()
    lowest = math.inf
    for (scheduler, _seed), steps in sorted(studies.items()):
        points = [(s.cum_epochs, s.best - offset) for s in steps if math.isfinite(s.best)]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        lowest = min(lowest, *ys)
        label = None if scheduler in labelled else scheduler
        labelled.add(scheduler)
        ax.step(xs, ys, where="post", color=colours.get(scheduler), alpha=0.7, label=label)
    ax.set_xscale("log")
    if lowest > 0:
        ax.set_yscale("log")
    else:  # the CNN's best run has regret 0
        ax.set_yscale("symlog", linthresh=1e-2)
    ax.set_xlabel("epochs trained (cumulative, trials in creation order)")
    ax.set_ylabel("best regret of COMPLETE trials")
    ax.set_title(task)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
