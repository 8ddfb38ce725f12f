"""Pareto dominance, fronts and crowding: how several objectives order a set of results.

With one objective, results line up by value. With several (accuracy up, latency down) one
result may be better on one and worse on the other, so the order is by Pareto front (Deb et
al.'s fast non-dominated sort) and, within a front, by crowding distance (NSGA-II): a result
alone in its stretch of the front goes before one among near-copies.

Every function takes ``directions``, one ``"max"`` or ``"min"`` per objective. A vector with a
non-finite value (a diverged loss, a missing metric) is dominated by every finite vector and
dominates none: it falls to the last front and can never look good.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Point = Sequence[float]


def _signed(points: Sequence[Point], directions: Sequence[str]) -> np.ndarray:
    """The points as an ``(n, m)`` array in which larger is better on every objective."""
    wrong = [d for d in directions if d not in ("max", "min")]
    if wrong or not directions:
        raise ValueError(f"directions must be 'max' or 'min', got {list(directions)}")
    signs = np.array([1.0 if d == "max" else -1.0 for d in directions])
    return np.asarray(points, dtype=float).reshape(len(points), len(directions)) * signs


def _dominance(signed: np.ndarray) -> np.ndarray:
    """``d[i, j]``: point ``i`` dominates point ``j`` (of points already signed)."""
    finite = np.isfinite(signed).all(axis=1)
    at_least = (signed[:, None, :] >= signed[None, :, :]).all(axis=2)
    better = (signed[:, None, :] > signed[None, :, :]).any(axis=2)
    both = finite[:, None] & finite[None, :]
    return (at_least & better & both) | (finite[:, None] & ~finite[None, :])


def dominates(a: Point, b: Point, directions: Sequence[str]) -> bool:
    """Whether ``a`` is at least as good as ``b`` on every objective and better on one.

    Example:
        >>> dominates((0.9, 10.0), (0.8, 12.0), ["max", "min"])
        True
        >>> dominates((0.9, 12.0), (0.8, 10.0), ["max", "min"])
        False
        >>> dominates((0.1, 99.0), (0.9, float("nan")), ["max", "min"])
        True
    """
    return bool(_dominance(_signed([a, b], directions))[0, 1])


def nondominated_sort(points: Sequence[Point], directions: Sequence[str]) -> list[list[int]]:
    """The Pareto fronts of ``points`` as lists of indices (ascending), first front first.

    Example:
        >>> nan = float("nan")
        >>> points = [(0.9, 30.0), (0.8, 10.0), (0.7, 20.0), (0.6, 40.0), (nan, 5.0)]
        >>> nondominated_sort(points, ["max", "min"])
        [[0, 1], [2], [3], [4]]
    """
    dominated = _dominance(_signed(points, directions))
    count = dominated.sum(axis=0)  # how many points dominate each one
    remaining = np.ones(len(points), dtype=bool)
    fronts: list[list[int]] = []
    while remaining.any():  # dominance is acyclic: every round finds a front
        front = np.flatnonzero(remaining & (count == 0))
        fronts.append(front.tolist())
        remaining[front] = False
        count = count - dominated[front].sum(axis=0)
    return fronts


def pareto_front(points: Sequence[Point], directions: Sequence[str]) -> list[int]:
    """The indices of the points no other point dominates.

    Example:
        >>> pareto_front([(1.0, 1.0), (2.0, 0.0), (0.5, 0.5)], ["max", "max"])
        [0, 1]
        >>> pareto_front([], ["max"])
        []
    """
    fronts = nondominated_sort(points, directions)
    return fronts[0] if fronts else []


def crowding_distance(
    points: Sequence[Point], indices: Sequence[int], directions: Sequence[str]
) -> list[float]:
    """NSGA-II's crowding distance of ``points[i]`` for each ``i`` in ``indices`` (usually one
    front), measured among those points only: larger is lonelier.

    The extremes on an objective get ``inf``; an objective on which the points all agree adds
    nothing. Identical points count once and share a distance; a non-finite point gets 0.

    Example:
        >>> points = [(0.0, 4.0), (1.0, 3.0), (3.0, 1.0), (4.0, 0.0), (1.0, 3.0)]
        >>> crowding_distance(points, [0, 1, 2, 3, 4], ["max", "max"])
        [inf, 1.5, 1.5, inf, 1.5]
    """
    signed = _signed(points, directions)[list(indices)]
    finite = np.isfinite(signed).all(axis=1)
    unique, inverse = np.unique(signed[finite], axis=0, return_inverse=True)
    distance = np.zeros(len(unique))
    for column in unique.T:
        span = column.max() - column.min() if len(column) else 0.0
        if span == 0:
            continue
        order = np.argsort(column, kind="stable")
        distance[order[[0, -1]]] = np.inf
        distance[order[1:-1]] += (column[order[2:]] - column[order[:-2]]) / span
    result = np.zeros(len(signed))
    result[finite] = distance[inverse.reshape(-1)]
    return [float(d) for d in result]


def rank_keys(points: Sequence[Point], directions: Sequence[str]) -> list[tuple[int, float]]:
    """Each point's ``(front, -crowding distance)``: the smaller key is the better point.

    Identical points get identical keys, so they tie.

    Example:
        >>> rank_keys([(3.0,), (1.0,), (3.0,), (2.0,)], ["max"])
        [(0, 0.0), (2, 0.0), (0, 0.0), (1, 0.0)]
    """
    keys: list[tuple[int, float]] = [(0, 0.0)] * len(points)
    for number, front in enumerate(nondominated_sort(points, directions)):
        distances = crowding_distance(points, front, directions)
        for index, distance in zip(front, distances, strict=True):
            keys[index] = (number, 0.0 - distance)  # 0.0, not -0.0
    return keys
