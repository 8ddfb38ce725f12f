"""A space-filling first batch: the configs proposed before any result can inform them.

When K trials run at once, the first K configs are proposed with nothing learned, and Optuna's
samplers draw them independently at random: clumps and gaps. A scrambled Sobol sequence
(``scipy.stats.qmc``, the library's own low-discrepancy points, rather than points written
here) covers the space evenly instead: every parameter's range is split into equal strata and
the first 2**m points fill them together. :class:`SpaceFilling` hands each parameter of trial
``n`` the value of point ``n`` in that parameter's dimension; a conditional parameter keeps a
dimension of its own, used when it is active.

Example:
    >>> from optuna.distributions import FloatDistribution
    >>> fill = SpaceFilling(["lr", "dropout"], seed=0)
    >>> values = [fill.value(n, "dropout", FloatDistribution(0.0, 0.5)) for n in range(4)]
    >>> sorted(int(v // 0.125) for v in values)  # one point in each quarter of the range
    [0, 1, 2, 3]
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

BLOCK = 256
"""Points drawn at a time (a power of two keeps Sobol's balance)."""


def from_unit(u: float, dist: BaseDistribution) -> Any:
    """The value of ``dist`` at quantile ``u`` in ``[0, 1)``: equal strata of a float's range
    (of its logarithm when ``log``), of an int's or a step's values, of a choice's options.

    Example:
        >>> from_unit(0.99, CategoricalDistribution(["sgd", "adam", "adamw"]))
        'adamw'
        >>> from_unit(0.5, IntDistribution(1, 4))
        3
        >>> round(from_unit(0.5, FloatDistribution(1e-4, 1e-2, log=True)), 6)
        0.001
    """
    u = min(max(float(u), 0.0), math.nextafter(1.0, 0.0))
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[int(u * len(dist.choices))]
    if isinstance(dist, IntDistribution):
        if dist.log:  # equal strata of log(value), each int taking its rounding interval
            low, high = math.log(dist.low - 0.5), math.log(dist.high + 0.5)
            return min(max(round(math.exp(low + u * (high - low))), dist.low), dist.high)
        count = (dist.high - dist.low) // dist.step + 1
        return dist.low + int(u * count) * dist.step
    if not isinstance(dist, FloatDistribution):
        raise TypeError(f"no space-filling value for {type(dist).__name__}")
    if dist.log:
        low, high = math.log(dist.low), math.log(dist.high)
        return math.exp(low + u * (high - low))
    if dist.step is not None:
        count = round((dist.high - dist.low) / dist.step) + 1
        return min(dist.low + int(u * count) * dist.step, dist.high)
    return dist.low + u * (dist.high - dist.low)


class SpaceFilling:
    """Scrambled Sobol points, one dimension per parameter name, one point per trial number.

    Args:
        names: Every parameter of the space, in a fixed order (its dimensions).
        seed: The scramble's seed (``None``: a fresh one).
    """

    def __init__(self, names: Sequence[str], seed: int | None) -> None:
        self._dims = {name: i for i, name in enumerate(names)}
        self._seed = seed
        self._points = np.empty((0, max(1, len(names))))

    def value(self, number: int, name: str, dist: BaseDistribution) -> Any:
        """Parameter ``name`` of point ``number``."""
        while number >= len(self._points):
            self._draw()
        dim = self._dims.get(name)
        if dim is None:  # a parameter the space did not name: its own, fixed stream
            u = np.random.default_rng([self._seed or 0, number, zlib.crc32(name.encode())]).random()
            return from_unit(u, dist)
        return from_unit(self._points[number, dim], dist)

    def _draw(self) -> None:
        from scipy.stats import qmc

        sobol = qmc.Sobol(self._points.shape[1], scramble=True, seed=self._seed)
        self._points = sobol.random(len(self._points) + BLOCK)
