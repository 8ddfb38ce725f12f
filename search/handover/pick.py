"""Choose one trial by constraints: ``export --pick "latency_ms<5,val_loss<=0.3"``.

A study with several objectives has no single best trial but a front of trade-offs; a
constraint says which trade-off is wanted. :func:`pick_trial` keeps the trials that satisfy
every constraint and returns the best of them on the primary (first) objective.

- The pool is the Pareto front of a multi-objective study. A single-objective study has no
  front (its "front" is its best trial), so there the pool is every COMPLETE trial: the pick
  is then the best trial under constraints on its other metrics.
- A constraint is ``METRIC OP NUMBER`` with ``OP`` one of ``<``, ``<=``, ``>``, ``>=``;
  several are comma-separated and must all hold. ``METRIC`` is an objective (the trial's
  value) or a metric of the trial's last epoch (its user attribute ``metrics``); a trial
  without that metric does not satisfy the constraint.
- A constraint that cannot be read, an unknown metric, or one nothing satisfies raises
  :class:`~search.handover.train.ExportError` with one line naming what was expected and the
  values seen.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from search.handover.candidates import complete_trials
from search.handover.train import ExportError
from search.record.queries import pareto_trials

if TYPE_CHECKING:
    import optuna

    from search.specs.schema import StudySpec

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][\w.\-/]*)\s*(<=|>=|<|>)\s*([^\s<>=]+)\s*$")
_SHOWN = 8
"""At most this many distinct values of a metric in an error line (else its range)."""


@dataclass(frozen=True)
class Constraint:
    """``metric op bound``, e.g. ``latency_ms < 5``."""

    metric: str
    op: str
    bound: float

    def holds(self, value: float | None) -> bool:
        """Whether ``value`` satisfies the constraint (a missing or NaN value never does)."""
        if value is None or math.isnan(value):
            return False
        return OPERATORS[self.op](value, self.bound)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


def parse_constraints(text: str) -> list[Constraint]:
    """The comma-separated constraints of ``text``.

    Example:
        >>> parse_constraints("latency_ms<5, val_loss >= 0.1")
        [Constraint(metric='latency_ms', op='<', bound=5.0), Constraint(metric='val_loss', \
op='>=', bound=0.1)]

    Raises:
        ExportError: When a part is not ``METRIC OP NUMBER``.
    """
    constraints = []
    for part in text.split(","):
        match = _CONSTRAINT.match(part)
        bound = _number(match.group(3)) if match else None
        if match is None or bound is None:
            raise ExportError(
                f"--pick: expected METRIC<NUMBER (operators <, <=, >, >=; several "
                f"comma-separated, e.g. 'latency_ms<5,val_loss<=0.3'), got {part.strip()!r}"
            )
        constraints.append(Constraint(match.group(1), match.group(2), bound))
    return constraints


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def trial_metrics(
    trial: optuna.trial.FrozenTrial, objectives: Sequence[str]
) -> dict[str, float | None]:
    """The trial's last-epoch metrics (user attribute ``metrics``) and its objective values."""
    recorded = trial.user_attrs.get("metrics")
    found: dict[str, float | None] = {}
    if isinstance(recorded, Mapping):
        found.update({str(k): float(v) for k, v in recorded.items() if _is_number(v)})
    found.update(zip(objectives, (float(v) for v in trial.values or ()), strict=False))
    return found


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def pick_pool(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The trials ``--pick`` chooses from: the Pareto front, or every COMPLETE trial when the
    study has one objective (module docstring)."""
    done = complete_trials(study)
    if len(study.directions) == 1:
        return done
    front = {t.number for t in pareto_trials(study)}
    return [t for t in done if t.number in front]


def pick_trial(
    study: optuna.Study, spec: StudySpec, text: str
) -> tuple[optuna.trial.FrozenTrial, list[Constraint], int]:
    """The pool's best trial on the primary objective among those satisfying ``text``.

    Returns:
        The trial, the parsed constraints and how many trials of the pool satisfied them.

    Raises:
        ExportError: When ``text`` cannot be read, names an unknown metric, or no trial of
            the pool satisfies it.
    """
    constraints = parse_constraints(text)
    names = [o.metric for o in spec.objectives]
    pool = pick_pool(study)
    seen = {t.number: trial_metrics(t, names) for t in pool}
    known = set(names).union(*(m.keys() for m in seen.values()))
    for c in constraints:
        if c.metric not in known:
            others = sorted(known - set(names))
            raise ExportError(
                f"--pick: unknown metric {c.metric!r} in {text!r}; expected an objective "
                f"({', '.join(names)}) or a metric the trials recorded "
                f"({', '.join(others) or 'none'})"
            )
    fits = [t for t in pool if all(c.holds(seen[t.number].get(c.metric)) for c in constraints)]
    if not fits:
        raise ExportError(_nothing_fits(text, constraints, pool, seen, spec.multi_objective))
    sign = -1.0 if spec.primary.mode == "max" else 1.0
    best = min(fits, key=lambda t: (sign * float(t.values[0]), t.number))
    return best, constraints, len(fits)


def _nothing_fits(
    text: str,
    constraints: Sequence[Constraint],
    pool: Sequence[optuna.trial.FrozenTrial],
    seen: Mapping[int, Mapping[str, float | None]],
    multi: bool,
) -> str:
    """``--pick 'latency_ms<1': no trial ... satisfies it; seen latency_ms: 2, 4, 8``."""
    where = f"the Pareto front ({len(pool)} trials)" if multi else f"{len(pool)} COMPLETE trials"
    parts = []
    for metric in dict.fromkeys(c.metric for c in constraints):
        values = sorted({v for m in seen.values() if (v := m.get(metric)) is not None})
        parts.append(f"{metric} {_values(values)}")
    expected = " and ".join(str(c) for c in constraints)
    return (
        f"--pick {text!r}: no trial of {where} satisfies {expected}; seen {'; '.join(parts)}; "
        "loosen the constraint"
    )


def _values(values: Sequence[float]) -> str:
    """``2, 4, 8`` or ``0.1 to 0.9 (12 values)`` or ``none``."""
    if not values:
        return "none"
    if len(values) <= _SHOWN:
        return ", ".join(f"{v:.4g}" for v in values)
    return f"{values[0]:.4g} to {values[-1]:.4g} ({len(values)} values)"
