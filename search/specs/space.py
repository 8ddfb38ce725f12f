"""The search space: YAML distributions, checked once, then sampled define-by-run on Optuna.

Going straight from the YAML to Optuna's ``suggest_*`` calls (not through Ray's ``tune.*``
domains) keeps integer bounds inclusive on both ends and lets conditional parameters exist only
when their condition holds, which Optuna records truthfully.

Example:
    >>> import optuna
    >>> space = {"opt": Param(choice=["sgd", "adam"]),
    ...          "momentum": Param(uniform=(0.8, 0.99), when={"opt": "sgd"})}
    >>> trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(0)).ask()
    >>> params = sample(trial, space)
    >>> ("momentum" in params) == (params["opt"] == "sgd")
    True
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

if TYPE_CHECKING:
    import optuna

DISTRIBUTIONS = ("uniform", "loguniform", "int", "choice", "fixed")
_FIELD = {name: name for name in DISTRIBUTIONS} | {"int": "int_"}


class Param(BaseModel):
    """One searchable parameter: exactly one distribution, plus options.

    Args:
        uniform: ``[low, high]`` floats.
        loguniform: ``[low, high]`` floats, ``low > 0``.
        int: ``[low, high]`` integers, both inclusive.
        choice: A non-empty list of values.
        fixed: A single value (recorded in the config, not searched).
        step: Grid step for ``uniform`` or ``int``.
        log: Sample ``int`` on a log scale.
        when: Condition on other parameters, ``{name: value}`` or ``{name: [values]}``;
            the parameter exists only when every condition holds.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    int_: tuple[builtins.int, builtins.int] | None = Field(None, alias="int")
    choice: list[Any] | None = None
    fixed: Any = None
    step: float | None = None
    log: bool = False
    when: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_distribution(self) -> Param:
        given = [name for name in DISTRIBUTIONS if _FIELD[name] in self.model_fields_set]
        if len(given) != 1:
            raise ValueError(
                f"expected exactly one of {', '.join(DISTRIBUTIONS)}, got {given or 'none'}"
            )
        kind = given[0]
        bounds = getattr(self, _FIELD[kind]) if kind in ("uniform", "loguniform", "int") else None
        if bounds is not None and not bounds[0] < bounds[1]:
            raise ValueError(f"{kind}: low ({bounds[0]}) must be below high ({bounds[1]})")
        if kind == "loguniform" and bounds is not None and bounds[0] <= 0:
            raise ValueError(f"loguniform: low must be above 0, got {bounds[0]}")
        if kind == "choice" and not self.choice:
            raise ValueError("choice: expected a non-empty list of values")
        if self.step is not None and (kind not in ("uniform", "int") or self.step <= 0):
            raise ValueError("step: only for uniform or int, and must be above 0")
        if self.log and kind != "int":
            raise ValueError("log: only for int (use loguniform for floats)")
        if self.log and self.step not in (None, 1):
            raise ValueError("log: cannot be combined with a step other than 1")
        return self

    @model_serializer(mode="plain")
    def _compact(self) -> dict[str, Any]:
        """Only what the YAML said, under the YAML's names (``int``, not ``int_``)."""
        out: dict[str, Any] = {}
        for field in self.model_fields_set:
            value = getattr(self, field)
            out["int" if field == "int_" else field] = (
                list(value) if isinstance(value, tuple) else value
            )
        return out

    @property
    def kind(self) -> str:
        """The name of this parameter's distribution."""
        return next(name for name in DISTRIBUTIONS if _FIELD[name] in self.model_fields_set)

    def allowed(self) -> list[Any] | None:
        """The values this parameter can take, when finite (choice and fixed)."""
        if self.kind == "choice":
            return list(self.choice or [])
        if self.kind == "fixed":
            return [self.fixed]
        return None


def check_config(space: Mapping[str, Param], config: Mapping[str, Any]) -> None:
    """Checks that every value of ``config`` is one its parameter of ``space`` can take.

    Raises:
        ValueError: ``<name>: ...``, naming the first parameter that is unknown or whose value
            is out of its range.

    Example:
        >>> space = {"lr": Param(loguniform=(1e-4, 1e-1)), "opt": Param(choice=["sgd", "adam"])}
        >>> check_config(space, {"lr": 1e-3, "opt": "adam"})
        >>> check_config(space, {"lr": 1.0})
        Traceback (most recent call last):
        ...
        ValueError: lr: expected a value in [0.0001, 0.1], got 1.0
    """
    for name, value in config.items():
        if name not in space:
            raise ValueError(f"{name}: not a parameter of the space ({', '.join(space)})")
        param, allowed = space[name], space[name].allowed()
        if allowed is not None:
            if value not in allowed:
                raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")
            continue
        low, high = param.uniform or param.loguniform or param.int_ or (0, 0)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not low <= value <= high or (param.kind == "int" and value != int(value)):
            raise ValueError(f"{name}: expected a value in [{low}, {high}], got {value!r}")


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def check_space(space: Mapping[str, Param], fixed: Mapping[str, Any]) -> None:
    """Checks the whole space: conditions name real parameters, values they can take, no cycles.

    Raises:
        ValueError: Naming the parameter, as ``space.<name>.when: ...``.
    """
    for name in space:
        if name in fixed:
            raise ValueError(f"space.{name}: also given in fixed; keep it in one place")
    for name, param in space.items():
        for parent, values in (param.when or {}).items():
            if parent not in space:
                raise ValueError(f"space.{name}.when: names {parent!r}, which is not in space")
            allowed = space[parent].allowed()
            bad = [v for v in _as_list(values) if allowed is not None and v not in allowed]
            if bad:
                raise ValueError(
                    f"space.{name}.when: {parent} can never be {bad[0]!r} (expected one of "
                    f"{allowed})"
                )
    order(space)


def order(space: Mapping[str, Param]) -> list[str]:
    """Parameter names with every condition's parent before its child."""
    done: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in done:
            return
        if name in visiting:
            raise ValueError(f"space.{name}.when: conditions form a cycle")
        visiting.add(name)
        for parent in space[name].when or {}:
            visit(parent)
        visiting.discard(name)
        done.append(name)

    for name in space:
        visit(name)
    return done


def is_active(param: Param, params: Mapping[str, Any]) -> bool:
    """Whether ``param``'s condition holds for the values sampled so far."""
    return all(
        parent in params and params[parent] in _as_list(values)
        for parent, values in (param.when or {}).items()
    )


def suggest(trial: optuna.Trial, name: str, param: Param) -> Any:
    """Asks Optuna for one value of ``param``."""
    kind = param.kind
    if kind == "uniform":
        low, high = param.uniform or (0.0, 0.0)
        return trial.suggest_float(name, low, high, step=param.step)
    if kind == "loguniform":
        low, high = param.loguniform or (0.0, 0.0)
        return trial.suggest_float(name, low, high, log=True)
    if kind == "int":
        low, high = param.int_ or (0, 0)
        return trial.suggest_int(name, low, high, step=int(param.step or 1), log=param.log)
    if kind == "choice":
        return trial.suggest_categorical(name, param.choice or [])
    return param.fixed


def sample(trial: optuna.Trial, space: Mapping[str, Param]) -> dict[str, Any]:
    """Samples every active parameter of ``space`` on ``trial`` (define-by-run)."""
    params: dict[str, Any] = {}
    for name in order(space):
        if is_active(space[name], params):
            params[name] = suggest(trial, name, space[name])
    return params


def grid(space: Mapping[str, Param]) -> dict[str, list[Any]]:
    """The grid for Optuna's ``GridSampler``: every searched parameter must be finite.

    Raises:
        ValueError: When a parameter is continuous or conditional.
    """
    out: dict[str, list[Any]] = {}
    for name, param in space.items():
        if param.when:
            raise ValueError(f"space.{name}: the grid sampler cannot take conditional parameters")
        if param.kind == "int" and param.int_ is not None and not param.log:
            low, high = param.int_
            out[name] = list(range(low, high + 1, int(param.step or 1)))
        elif param.kind == "choice":
            out[name] = param.allowed() or []
        elif param.kind != "fixed":
            raise ValueError(f"space.{name}: the grid sampler needs choice or int parameters")
    return out
