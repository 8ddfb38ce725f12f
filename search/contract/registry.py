"""Finding a trainable and reading what its module declares, in one place.

A spec names a trainable by a built-in name (:data:`BUILTIN`, imported only when used, so a
PyTorch run never imports TensorFlow) or as ``package.module:function``. Beside the function,
its module may declare:

``DEFAULTS``
    A mapping of every knob the trainable reads to its default. The spec's knobs are checked
    against it before any trial starts, and an exported config lists every knob.
``DATA_PARALLEL``
    ``True`` (one process per device, ``torch.distributed``: :data:`PROCESSES`) or
    ``"in_process"`` (one process mirrors the model over its devices: :data:`IN_PROCESS`).
An export hook
    ``export(config, data, ctx, out_dir) -> metrics`` beside ``train``, or ``<function>_export``
    beside any other function (:mod:`search.contract.driver` has the ``train_to_end`` helper).

:func:`declarations` reads all of them; nothing else in the framework imports a trainable.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from search.contract.context import ExportFn, TrainFn

BUILTIN: dict[str, str] = {
    "torch_cnn": "trainables.torch.cnn:train",
    "torch_rnn": "trainables.torch.rnn:train",
    "torch_transfer": "trainables.torch.transfer:train",
    "tf_cnn": "trainables.tf.cnn:train",
    "tf_transfer": "trainables.tf.transfer:train",
}
"""Registry of built-in trainables: name -> ``module:function``, imported lazily."""

PROCESSES: Final = "processes"
"""Data-parallel mode: one process per device, one ``torch.distributed`` group per trial."""
IN_PROCESS: Final = "in_process"
"""Data-parallel mode: one process that spreads the trial over its devices itself."""
ParallelMode = Literal["processes", "in_process"] | None


class UnknownTrainableError(ValueError):
    """The spec names a trainable that is neither built in nor importable."""


def target(name: str) -> tuple[str, str]:
    """``(module, function)`` that ``name`` designates, without importing anything.

    Raises:
        UnknownTrainableError: When ``name`` is neither built in nor ``module:function``.

    Example:
        >>> target("search.testing:curve")
        ('search.testing', 'curve')
    """
    module, sep, func = BUILTIN.get(name, name).partition(":")
    if not sep or not module or not func.isidentifier():
        known = ", ".join(sorted(BUILTIN))
        raise UnknownTrainableError(
            f"unknown trainable {name!r}: expected one of {known} or 'package.module:function'"
        )
    return module, func


def check_trainable(name: str) -> None:
    """Checks, without importing it, that ``name``'s module can be found.

    Raises:
        UnknownTrainableError: When ``name`` is not built in and not an importable
            ``module:function`` path.
    """
    module, _ = target(name)
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise UnknownTrainableError(f"trainable module {module!r} cannot be imported")


def resolve_function(name: str, what: str = "function") -> Any:
    """Imports ``package.module:function`` and returns the function.

    Raises:
        UnknownTrainableError: One line naming what is missing (module or function).

    Example:
        >>> resolve_function("search.testing:curve").__name__
        'curve'
    """
    module_name, sep, func_name = name.partition(":")
    if not sep or not module_name or not func_name.isidentifier():
        raise UnknownTrainableError(f"{what} {name!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownTrainableError(
            f"{what} {name!r}: cannot import {module_name!r} ({type(exc).__name__}: {exc})"
        ) from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise UnknownTrainableError(
            f"{what} {name!r}: module {module_name!r} has no function {func_name!r}"
        )
    return fn


@dataclass(frozen=True)
class Declarations:
    """What a trainable's module declares (module docstring).

    Args:
        name: The trainable's name in the spec.
        train: The training generator function.
        defaults: ``DEFAULTS`` (knob -> default), or ``None`` when the module declares none.
        data_parallel: How one trial trains on several devices (``None``: one replica).
        export: The export hook, or ``None``.
    """

    name: str
    train: TrainFn
    defaults: Mapping[str, Any] | None = None
    data_parallel: ParallelMode = None
    export: ExportFn | None = None


def _parallel_mode(declared: Any) -> ParallelMode:
    if declared is True or declared == PROCESSES:
        return PROCESSES
    if declared == IN_PROCESS:
        return IN_PROCESS
    return None


@functools.cache
def declarations(name: str) -> Declarations:
    """Imports ``name``'s module once and reads its declarations.

    Raises:
        UnknownTrainableError: When the module or the function is missing.

    Example:
        >>> d = declarations("search.testing:curve")
        >>> callable(d.train), d.export is not None, d.data_parallel
        (True, True, None)
    """
    check_trainable(name)
    module_name, func_name = target(name)
    module = importlib.import_module(module_name)
    train = getattr(module, func_name, None)
    if not callable(train):
        raise UnknownTrainableError(
            f"trainable {name!r}: module {module_name!r} has no function {func_name!r}"
        )
    hooks = [f"{func_name}_export"] + (["export"] if func_name == "train" else [])
    export = next((h for h in (getattr(module, n, None) for n in hooks) if callable(h)), None)
    defaults = getattr(module, "DEFAULTS", None)
    return Declarations(
        name=name,
        train=train,
        defaults=defaults if isinstance(defaults, Mapping) else None,
        data_parallel=_parallel_mode(getattr(module, "DATA_PARALLEL", None)),
        export=export,
    )
