"""Continuous test functions as tables for ``benchmarks/sampler_settings.py``.

The published tables (``benchmarks/tables.py``) give each parameter a few values that
interact weakly. A user's space is often the other kind: a learning rate, a weight decay, a
dropout, continuous and interacting. :class:`Function` puts a closed-form function behind
the two calls the simulation makes of a :class:`~benchmarks.tables.Table`
(:meth:`Function.observe` and :meth:`Function.log_regret`), so a sampler's plan for K trials
at once is measured on both kinds of space.

``hartmann6``: Hartmann 6 at full fidelity (``benchmarks/mfhartmann.py``), six ``uniform``
parameters on ``[0, 1]``, its value observed without noise; every trial costs 1 s ± 50 %
(drawn by the run's seed), so results arrive out of the order they were asked.

Example:
    >>> from benchmarks.mfhartmann import X_STAR
    >>> f = FUNCTIONS["hartmann6"]
    >>> value, cost, mean = f.observe(dict(zip(f.names, X_STAR)), "index", np.random.default_rng(0))
    >>> round(value - f.best_loss, 4), 0.5 <= cost <= 1.5
    (0.0, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.mfhartmann import F_STAR, PARAMS, hartmann6

__all__ = ["FUNCTIONS", "Function"]


@dataclass(frozen=True)
class Function:
    """A function to minimize, searched as a table is (see the module's text).

    Args:
        task: Its name, as ``--tables`` takes it.
        names: The parameters, each ``uniform`` on ``[0, 1]``.
        value: The function of the parameters' values, in ``names`` order.
        best_loss: Its global minimum.
        floor: The regret that counts as found (a log scale needs one).
    """

    task: str
    names: Sequence[str]
    value: Callable[[Sequence[float]], float]
    best_loss: float
    floor: float = 1e-6

    def space(self) -> dict[str, Any]:
        """The spec's ``space``: every parameter ``uniform`` on ``[0, 1]``."""
        return {name: {"uniform": [0.0, 1.0]} for name in self.names}

    def observe(
        self, params: Mapping[str, Any], kind: str, rng: np.random.Generator
    ) -> tuple[float, float, float]:
        """A trial's reported loss, its cost in seconds and its true loss (``kind`` is
        ignored: the space has one way to be written)."""
        loss = float(self.value([float(params[n]) for n in self.names]))
        return loss, float(rng.uniform(0.5, 1.5)), loss

    def log_regret(self, loss: float) -> float:
        """``log10`` of the regret of ``loss``, floored at :attr:`floor`."""
        return math.log10(max(loss - self.best_loss, self.floor))


FUNCTIONS = {"hartmann6": Function("hartmann6", PARAMS, hartmann6, F_STAR)}
"""Every function, by task name."""
