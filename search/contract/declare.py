"""The one place a trainable declares its optional parts: the :func:`trainable` decorator.

A trainable is a plain generator function. What the framework may want to know beyond it sits
in one declaration, written where the function is::

    from search.contract import trainable, train_to_end

    @trainable(defaults={"lr": 1e-3, "hidden": 32})
    def train(config, data, ctx):
        ...
        return model  # optional: what train_to_end hands the export hook

    @train.exporter
    def export(config, data, ctx, out_dir):
        trained = train_to_end(train, config, data, ctx)
        torch.save(trained.model.state_dict(), out_dir / "model.pt")
        return trained.metrics

``defaults``
    Every knob the trainable reads and its default. The spec's knobs are checked against it
    before any trial starts, and an exported config lists every knob.
``data_parallel``
    ``True`` or ``"processes"`` (one process per device, ``torch.distributed``) or
    ``"in_process"`` (one process spreads the model over its devices itself).
``export``
    The export hook ``export(config, data, ctx, out_dir) -> metrics``: pass it here, or
    decorate it with ``@train.exporter`` when it is defined after ``train``.

The decorated function stays the same function (Ray pickles it by name); the declaration is
an attribute of it, which :func:`search.contract.registry.declarations` reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, cast, overload

from search.contract.context import ExportFn, TrainFn

ATTRIBUTE: Final = "__search_trainable__"
"""The function attribute that holds a trainable's :class:`Declaration`."""

ParallelFlag = bool | Literal["processes", "in_process"] | None


@dataclass
class Declaration:
    """What a trainable declares (module docstring). Mutable only through ``exporter``."""

    defaults: Mapping[str, Any] | None = None
    data_parallel: ParallelFlag = None
    export: ExportFn | None = None


class DeclaredTrainable(Protocol):
    """A training generator function that carries a :class:`Declaration`."""

    __search_trainable__: Declaration

    def __call__(self, config: Any, data: Any, ctx: Any) -> Any: ...

    def exporter(self, hook: ExportFn) -> ExportFn: ...


@overload
def trainable(fn: TrainFn, /) -> DeclaredTrainable: ...


@overload
def trainable(
    *,
    defaults: Mapping[str, Any] | None = None,
    data_parallel: ParallelFlag = None,
    export: ExportFn | None = None,
) -> Callable[[TrainFn], DeclaredTrainable]: ...


def trainable(
    fn: TrainFn | None = None,
    /,
    *,
    defaults: Mapping[str, Any] | None = None,
    data_parallel: ParallelFlag = None,
    export: ExportFn | None = None,
) -> DeclaredTrainable | Callable[[TrainFn], DeclaredTrainable]:
    """Declares a training generator's defaults, data-parallel mode and export hook.

    ``@trainable`` alone (no parentheses) declares none of them and gives the function its
    ``.exporter`` decorator.

    Example:
        >>> @trainable(defaults={"lr": 0.1})
        ... def train(config, data, ctx):
        ...     yield {"loss": config["lr"]}
        >>> @train.exporter
        ... def export(config, data, ctx, out_dir):
        ...     return {}
        >>> declared(train).defaults, declared(train).export is export
        ({'lr': 0.1}, True)
        >>> @trainable
        ... def plain(config, data, ctx):
        ...     yield {"loss": 0.0}
        >>> declared(plain).defaults is None and callable(plain.exporter)
        True
    """
    if data_parallel not in (None, False, True, "processes", "in_process"):
        raise ValueError(
            f"data_parallel={data_parallel!r}: expected True, 'processes' or 'in_process'"
        )

    def wrap(function: TrainFn) -> DeclaredTrainable:
        declaration = Declaration(dict(defaults) if defaults else None, data_parallel, export)

        def exporter(hook: ExportFn) -> ExportFn:
            declaration.export = hook
            return hook

        setattr(function, ATTRIBUTE, declaration)
        setattr(function, "exporter", exporter)  # noqa: B010 (an attribute of a function)
        return cast(DeclaredTrainable, function)

    return wrap if fn is None else wrap(fn)


def declared(fn: Any) -> Declaration | None:
    """The :class:`Declaration` that :func:`trainable` attached to ``fn``, if any."""
    found = getattr(fn, ATTRIBUTE, None)
    return found if isinstance(found, Declaration) else None
