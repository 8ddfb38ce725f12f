"""Finding a trainable and reading what it declares, in one place.

A spec names a trainable by a built-in name (:data:`BUILTIN`, imported only when used, so a
PyTorch run never imports TensorFlow) or as ``package.module:function``. A function handed
over from Python (``search.run(trainable=fn)``, one defined in a notebook cell or a script's
``__main__``) is named the same way, ``module:function`` (:func:`hand_over`), and found in
this process's :data:`HANDED` before any import; its trials receive it with their job
(:func:`receive`), pickled by value where its module cannot be imported. What the function
declares beside itself (defaults, data-parallel mode, export hook) comes from the
:func:`~search.contract.declare.trainable` decorator. :func:`declarations` reads it; nothing
else in the framework imports a trainable.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import pkgutil
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from search.contract.context import ExportFn, TrainFn
from search.contract.declare import declared
from search.errors import closest, did_you_mean

BUILTIN: dict[str, str] = {
    "torch_cnn": "trainables.torch.cnn:train",
    "torch_rnn": "trainables.torch.rnn:train",
    "torch_resnet": "trainables.torch.resnet:train",
    "torch_transfer": "trainables.torch.transfer:train",
    "tf_cnn": "trainables.tf.cnn:train",
    "tf_transfer": "trainables.tf.transfer:train",
}
"""Registry of built-in trainables: name -> ``module:function``, imported lazily."""

BUILTIN_KNOBS: dict[str, str] = {
    "torch_cnn": "trainables.knobs:CNN_DEFAULTS",
    "torch_rnn": "trainables.knobs:RNN_DEFAULTS",
    "torch_resnet": "trainables.knobs:RESNET_DEFAULTS",
    "torch_transfer": "trainables.knobs:TORCH_TRANSFER_DEFAULTS",
    "tf_cnn": "trainables.knobs:CNN_DEFAULTS",
    "tf_transfer": "trainables.knobs:TF_TRANSFER_DEFAULTS",
}
"""Where each built-in's knobs are declared without its framework (``module:name``): the
trainable declares the same dict, and :func:`declared_defaults` reads it here, so checking a
spec imports no torch or TensorFlow in the driver (each a slow import, cold)."""

PROCESSES: Final = "processes"
"""Data-parallel mode: one process per device, one ``torch.distributed`` group per trial."""
IN_PROCESS: Final = "in_process"
"""Data-parallel mode: one process that spreads the trial over its devices itself."""
ParallelMode = Literal["processes", "in_process"] | None


class UnknownTrainableError(ValueError):
    """The spec names a trainable that is neither built in nor importable."""


HANDED: dict[str, Any] = {}
"""Functions handed over from Python in this process, by the name the spec gives them."""


def hand_over(fn: Any) -> str:
    """Registers ``fn`` (a trainable, a data loader) under ``module:function`` and returns
    that name, for a spec to name it; a function of a module that cannot be imported (a
    notebook's cell, a script's ``__main__``) is found here, and its trials receive it.

    Example:
        >>> def train(config, ctx):
        ...     yield {"loss": 1.0}
        >>> name = hand_over(train)
        >>> name, declarations(name).train is train
        ('search.contract.registry:train', True)
    """
    if not callable(fn):
        raise UnknownTrainableError(f"expected a function, got {type(fn).__name__}")
    qualname = re.sub(r"\W", "_", getattr(fn, "__qualname__", type(fn).__name__))
    name = f"{getattr(fn, '__module__', None) or '__main__'}:{qualname}"
    receive({name: fn})
    return name


def only_there(name: str, what: str) -> str:
    """The line for a ``__main__:function`` this process was not handed.

    Example:
        >>> only_there("__main__:train", "trainable")[:60]
        "trainable '__main__:train' was defined in a notebook or a sc"
    """
    return (
        f"{what} {name!r} was defined in a notebook or a script: only the Python process "
        "that defined it knows it; there, pass the function itself "
        "(search.run(..., trainable=fn) or search.load(..., trainable=fn))"
    )


def receive(handed: Mapping[str, Any]) -> None:
    """Takes functions handed over elsewhere (a trial's job carries the driver's
    :data:`HANDED`); a name that now means another function forgets what it declared."""
    if any(HANDED.get(k) is not v for k, v in handed.items()):
        HANDED.update(handed)
        declarations.cache_clear()


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
            + did_you_mean(name, BUILTIN)
        )
    return module, func


def check_trainable(name: str) -> None:
    """Checks, without importing it, that ``name``'s module can be found.

    Raises:
        UnknownTrainableError: When ``name`` is not built in and not an importable
            ``module:function`` path.
    """
    if name in HANDED:
        return
    module, _ = target(name)
    if module == "__main__":
        raise UnknownTrainableError(only_there(name, "trainable"))
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise UnknownTrainableError(
            f"trainable module {module!r} cannot be imported{module_hint(module)}"
        )


def module_hint(module: str) -> str:
    """`` (did you mean 'examples.keras_fit.wine'?)`` for a misspelled ``module``: its first
    part that cannot be found, against the modules beside it, and the rest as given (``''``
    when none is close).

    Example:
        >>> module_hint("search.testng"), module_hint("nowhere_pkg.x")
        (" (did you mean 'search.testing'?)", '')
    """
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        parent = ".".join(parts[: depth - 1])
        try:
            spec = importlib.util.find_spec(".".join(parts[:depth]))
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            continue
        try:
            where = importlib.util.find_spec(parent) if parent else None
        except (ImportError, ValueError):
            return ""
        path = None if where is None else where.submodule_search_locations
        if parent and path is None:
            return ""  # a module, not a package: nothing is beside the name
        names = [m.name for m in pkgutil.iter_modules(path)]
        match = closest(parts[depth - 1], names)
        meant = ".".join([*parts[: depth - 1], match, *parts[depth:]]) if match else ""
        return f" (did you mean {meant!r}?)" if meant else ""
    return ""


def resolve_function(name: str, what: str = "function") -> Any:
    """Imports ``package.module:function`` and returns the function.

    Raises:
        UnknownTrainableError: One line naming what is missing (module or function).

    Example:
        >>> resolve_function("search.testing:curve").__name__
        'curve'
    """
    if name in HANDED:
        return HANDED[name]
    module_name, sep, func_name = name.partition(":")
    if not sep or not module_name or not func_name.isidentifier():
        raise UnknownTrainableError(f"{what} {name!r}: expected 'package.module:function'")
    if module_name == "__main__":
        raise UnknownTrainableError(only_there(name, what))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = module_hint(module_name) if exc.name and module_name.startswith(exc.name) else ""
        raise UnknownTrainableError(
            f"{what} {name!r}: cannot import {module_name!r} ({type(exc).__name__}: {exc}){hint}"
        ) from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        functions = [k for k, v in vars(module).items() if callable(v) and not k.startswith("_")]
        raise UnknownTrainableError(
            f"{what} {name!r}: module {module_name!r} has no function {func_name!r}"
            + did_you_mean(func_name, functions)
        )
    return fn


@dataclass(frozen=True)
class Declarations:
    """What a trainable declares, as the framework uses it.

    Args:
        name: The trainable's name in the spec.
        train: The training generator function.
        defaults: Knob -> default, or ``None`` when the trainable declares none.
        data_parallel: How one trial trains on several devices (``None``: one replica).
        export: The export hook, or ``None``.
        declared: Whether ``train`` carries the :func:`~search.contract.declare.trainable`
            decorator (a plain function does not).
    """

    name: str
    train: TrainFn
    defaults: Mapping[str, Any] | None = None
    data_parallel: ParallelMode = None
    export: ExportFn | None = None
    declared: bool = False

    @property
    def returns(self) -> bool:
        """Whether ``train`` is a plain function, not a generator function (looked for under
        any ``functools.wraps`` wrapper and ``functools.partial``): it returns where a
        trainable yields one dict per epoch. ``False`` for other callables (an object with a
        ``__call__``), which only a trial can tell.

        Example:
            >>> declarations("search.testing:curve").returns
            False
            >>> declarations("search.testing:returns_dict").returns
            True
        """
        fn = inspect.unwrap(self.train)
        while isinstance(fn, functools.partial):
            fn = inspect.unwrap(fn.func)
        fn = getattr(fn, "__func__", fn)  # a bound method
        return inspect.isfunction(fn) and not inspect.isgeneratorfunction(fn)


def _parallel_mode(declared: Any) -> ParallelMode:
    if declared is True or declared == PROCESSES:
        return PROCESSES
    if declared == IN_PROCESS:
        return IN_PROCESS
    return None


def declared_defaults(name: str) -> Mapping[str, Any] | None:
    """The knobs ``name`` declares (knob -> default), ``None`` when it declares none; a
    built-in's from :data:`BUILTIN_KNOBS`, without importing its framework.

    Raises:
        UnknownTrainableError: When the module or the function is missing.

    Example:
        >>> declared_defaults("torch_cnn")["channels"]
        32
        >>> declared_defaults("search.testing:curve") is None
        True
    """
    if name in BUILTIN_KNOBS:
        module, _, attr = BUILTIN_KNOBS[name].partition(":")
        found: Mapping[str, Any] = getattr(importlib.import_module(module), attr)
        return found
    return declarations(name).defaults


@functools.cache
def declarations(name: str) -> Declarations:
    """Imports ``name``'s module once and reads what its function declares.

    A function without the :func:`~search.contract.declare.trainable` decorator declares
    nothing: no defaults (its knobs are not checked), one replica, no export hook.

    Raises:
        UnknownTrainableError: When the module or the function is missing.

    Example:
        >>> d = declarations("search.testing:curve")
        >>> callable(d.train), d.export is not None, d.data_parallel
        (True, True, None)
    """
    check_trainable(name)
    train = resolve_function(BUILTIN.get(name, name), what="trainable")
    found = declared(train)
    if found is None:
        return Declarations(name=name, train=train)
    return Declarations(
        name=name,
        train=train,
        defaults=found.defaults,
        data_parallel=_parallel_mode(found.data_parallel),
        export=found.export,
        declared=True,
    )
