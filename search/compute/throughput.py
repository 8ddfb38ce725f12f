"""How many trials to pack on one GPU by what it runs, not by what fits: the pure decision.

Ray's fractional GPUs are logical: trials that share a GPU share its time. Past the count at
which their kernels overlap, another trial only time-slices the GPU, and each trial runs
slower while the sum stays flat (or falls, with more memory and contexts). So
``gpus_per_trial: auto`` measures the images per second summed over 1, 2, 4, ... trials of
the space's largest config running at once on one GPU, as many as fit in its memory
(:mod:`search.compute.gpu_rates` runs them), and packs the fewest that come within
:data:`TOLERANCE` of the most it saw: fewer processes for the same work leave each trial more
memory and CPU.

Everything here is arithmetic on measured figures, tested with figures of the kind a GPU
gives (:func:`counts_to_try`, :func:`next_count`, :func:`choose`, :func:`decision`).
"""

from __future__ import annotations

from collections.abc import Mapping

TOLERANCE = 0.05
"""A count within this share of the highest summed rate counts as the highest (the spread of
two measurements of one count)."""


def counts_to_try(fit: int) -> list[int]:
    """1, 2, 4, ... up to ``fit`` (the most that fit in memory, and the CPUs allow), and ``fit``.

    Example:
        >>> counts_to_try(1), counts_to_try(6), counts_to_try(16)
        ([1], [1, 2, 4, 6], [1, 2, 4, 8, 16])
    """
    counts, k = [], 1
    while k < fit:
        counts.append(k)
        k *= 2
    return [*counts, max(1, fit)]


def next_count(rates: Mapping[int, float], fit: int, tolerance: float = TOLERANCE) -> int | None:
    """The next count to measure, or None when measuring more would not change the choice:
    every count measured, or the last one did not beat the best before it by more than
    ``tolerance`` (the GPU is full: more trials only share it).

    Example:
        >>> next_count({}, 8), next_count({1: 900.0}, 8), next_count({1: 900.0, 2: 1700.0}, 8)
        (1, 2, 4)
        >>> next_count({1: 900.0, 2: 1700.0, 4: 1720.0}, 8) is None   # flat: the GPU is full
        True
        >>> next_count({1: 900.0, 2: 1700.0}, 2) is None              # nothing more fits
        True
    """
    done = [k for k in counts_to_try(fit) if k in rates]
    if len(done) >= 2:
        last, before = rates[done[-1]], max(rates[k] for k in done[:-1])
        if last <= before * (1.0 + tolerance):
            return None
    for k in counts_to_try(fit):
        if k not in rates:
            return k
    return None


def choose(rates: Mapping[int, float], tolerance: float = TOLERANCE) -> int:
    """The fewest trials at once whose summed rate is within ``tolerance`` of the highest
    (1 when nothing was measured).

    Example:
        >>> choose({1: 900.0, 2: 1700.0, 4: 1760.0, 8: 1500.0})
        2
        >>> choose({1: 900.0, 2: 1700.0, 4: 2400.0})
        4
        >>> choose({})
        1
    """
    usable = {k: v for k, v in rates.items() if v > 0}
    if not usable:
        return 1
    best = max(usable.values())
    return min(k for k, v in usable.items() if v >= best * (1.0 - tolerance))


def decision(rates: Mapping[int, float], fit: int, tolerance: float = TOLERANCE) -> str:
    """What :func:`choose` picked and why, in words for the run's decision line.

    Example:
        >>> print(decision({1: 900.0, 2: 1700.0, 4: 1760.0}, 8))  # doctest: +NORMALIZE_WHITESPACE
        images/s summed over trials at once on one GPU: 1: 900, 2: 1,700, 4: 1,760;
        2 packed (the fewest within 5 % of the most; 8 fit)
        >>> decision({}, 4)
        'throughput not measured; 4 fit in memory'
    """
    if not any(v > 0 for v in rates.values()):
        return f"throughput not measured; {fit} fit in memory"
    shown = ", ".join(f"{k}: {v:,.0f}" for k, v in sorted(rates.items()))
    return (
        f"images/s summed over trials at once on one GPU: {shown}; {choose(rates, tolerance)} "
        f"packed (the fewest within {tolerance:.0%} of the most; {fit} fit)"
    ).replace("%", " %")
