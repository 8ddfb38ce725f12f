"""The one loop that drives a trainable's generator, wherever it runs.

A Ray trial (:mod:`search.tuning.worker`), a confirmation run, the final training of an export,
``python -m search train`` and the GPU memory probe all iterate a trainable the same way
(:func:`drive`): number each epoch, turn its metrics into plain floats once (and drop, by
name, those that are not numbers), stop after the first non-finite metric or at the epoch
budget, and close the generator however the loop ends. :func:`train_to_end` is that loop for
export hooks, which also need the model the trainable returns.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import math
import numbers
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, cast

from search.contract.context import RESERVED_PREFIX, ConfigError, Metrics, TrainFn, TrialContext
from search.errors import SearchError

if TYPE_CHECKING:
    from search.contract.dataset import Dataset


NOT_RETRIED = (
    TypeError,
    KeyError,
    NameError,
    AttributeError,
    ImportError,
    SyntaxError,
    ConfigError,
)
"""Errors of a trainable's code that fail the same way every time: the trial fails at once,
with its traceback written beside it, and is not retried (Tune retries whatever raises)."""


def as_number(value: Any) -> float | None:
    """``value`` as a Python float when it is a real number, else ``None``.

    Python and NumPy numbers, booleans (0 or 1) and tensors or arrays of one element (0-d or
    ``[x]``: NumPy, PyTorch, TensorFlow, JAX) are numbers; strings, ``None``, containers and
    arrays of more than one element are not. NumPy 2 scalars are not ``float``: this is where
    they become one, once.

    Example:
        >>> import numpy as np
        >>> as_number(np.float32(0.5)), as_number(np.array([2])), as_number(np.bool_(True))
        (0.5, 2.0, 1.0)
        >>> as_number("0.5"), as_number(None), as_number([0.5]), as_number(np.zeros(2))
        (None, None, None, None)
    """
    if value is None or isinstance(value, str | bytes):
        return None
    if isinstance(value, numbers.Real):  # bool too
        return float(value)
    if _elements(value) != 1:
        return None  # not an array or tensor, or not of one element
    item = getattr(value, "item", None)  # numpy scalars and arrays, torch and jax tensors
    numpy = getattr(value, "numpy", None)  # an eager TensorFlow tensor
    try:
        plain = item() if callable(item) else numpy() if callable(numpy) else None
    except (TypeError, ValueError, RuntimeError):
        return None
    if plain is None or plain is value:
        return None
    return as_number(plain)


def _elements(value: Any) -> int | None:
    """How many elements an array or tensor holds (``None`` when it is neither)."""
    numel = getattr(value, "numel", None)  # torch (its ``size`` is a method)
    if callable(numel):
        return int(numel())
    size = getattr(value, "size", None)  # numpy, jax
    if isinstance(size, int):
        return size
    shape = getattr(value, "shape", None)  # TensorFlow
    if shape is None:
        return None
    try:
        return math.prod(int(d) for d in shape)
    except (TypeError, ValueError):
        return None


def as_metrics(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Every real-number value of ``raw`` as a Python float; other values as they are."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        number = as_number(value)
        out[str(key)] = value if number is None else number
    return out


def nonfinite_reason(metrics: Mapping[str, Any], epoch: int) -> str | None:
    """Names the first metric that is NaN or infinite, or returns ``None``.

    Example:
        >>> nonfinite_reason({"val_loss": float("nan")}, 3)
        'val_loss is nan at epoch 3'
    """
    for key, value in metrics.items():
        number = as_number(value)
        if number is not None and not math.isfinite(number):
            return f"{key} is {number} at epoch {epoch}"
    return None


def metric_problem(metrics: Mapping[str, Any], metric: str, epoch: int) -> str | None:
    """Says why ``metrics`` (already :func:`as_metrics`) lacks a numeric ``metric``, or ``None``.

    Example:
        >>> metric_problem({"accuracy": 0.9, "loss": 0.1}, "val_accuracy", 1)
        'metric val_accuracy missing at epoch 1 (got keys: accuracy, loss)'
        >>> metric_problem({"val_accuracy": None}, "val_accuracy", 2)
        'metric val_accuracy is not a number at epoch 2 (got NoneType None)'
    """
    if metric not in metrics:
        keys = ", ".join(sorted(metrics)) or "none"
        return f"metric {metric} missing at epoch {epoch} (got keys: {keys})"
    value = metrics[metric]
    if not isinstance(value, float):
        shown = str(value).replace("\n", " ")
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        kind = type(value).__name__
        return f"metric {metric} is not a number at epoch {epoch} (got {kind} {shown})"
    return None


@dataclass(frozen=True)
class Epoch:
    """One epoch a trainable yielded.

    Args:
        number: The epoch's number (from the context's ``start_epoch``).
        metrics: Its metrics that are numbers, each a Python float.
        fail_reason: Set when a metric is NaN or infinite, or the objective metric is missing
            or not a number; the run ends with this epoch.
        dropped: The sorted names of the other metrics it yielded that are not numbers
            (strings, ``None``, lists, vectors...): left out of ``metrics``, so that nothing
            downstream (Ray Tune's results, the study) has to hold them.
    """

    number: int
    metrics: Metrics
    fail_reason: str | None = None
    dropped: tuple[str, ...] = ()


def drive(
    epochs: Iterable[Mapping[str, Any]],
    max_epochs: int,
    start: int = 1,
    metric: str | Sequence[str] = "",
) -> Generator[Epoch, None, None]:
    """Iterates a trainable's epochs until the budget, a non-finite metric, or its own end.

    With ``metric`` (the objective, or every objective of a multi-objective study), an epoch
    without it as a number also ends the run.

    The trainable's generator is closed when the loop ends, also when the caller stops early
    (close this generator, or use it in ``contextlib.closing``).

    Example:
        >>> [e.number for e in drive(iter([{"a": 1}, {"a": 2}, {"a": 3}]), max_epochs=2)]
        [1, 2]
        >>> [e.fail_reason for e in drive(iter([{"a": 1}, {"a": float("inf")}, {}]), 9)]
        [None, 'a is inf at epoch 2']
        >>> [(e.metrics, e.dropped) for e in drive(iter([{"a": 1, "tag": "x"}]), 9, metric="a")]
        [({'a': 1.0}, ('tag',))]
    """
    required = [metric] if isinstance(metric, str) else list(metric)
    _check_generator(epochs)
    try:
        for number, raw in enumerate(epochs, start=start):
            if not isinstance(raw, Mapping):
                raise ConfigError(
                    f"the trainable yielded a {type(raw).__name__} at epoch {number}; yield one "
                    "dict of metrics per epoch, e.g. yield {'val_loss': 0.3}"
                )
            _check_keys(raw, number)
            converted = as_metrics(raw)
            missing = (metric_problem(converted, m, number) for m in required if m)
            reason = next((m for m in missing if m), None) or nonfinite_reason(converted, number)
            metrics = {k: v for k, v in converted.items() if isinstance(v, float)}
            dropped = sorted(k for k in converted if k not in metrics and k not in required)
            yield Epoch(number, metrics, reason, tuple(dropped))
            if reason or number >= max_epochs:
                return
    finally:
        close = getattr(epochs, "close", None)
        if callable(close):
            close()


def _check_keys(metrics: Mapping[str, Any], number: int) -> None:
    """Refuses a metric whose name starts with :data:`RESERVED_PREFIX`: the worker's own
    keys travel under it, and one of the trainable's would be read as the worker's.

    Example:
        >>> _check_keys({"search/epoch": 3}, 1)
        Traceback (most recent call last):
        ...
        search.contract.context.ConfigError: the trainable yielded 'search/epoch' at epoch 1: ...
    """
    for key in metrics:
        if isinstance(key, str) and key.startswith(RESERVED_PREFIX):
            raise ConfigError(
                f"the trainable yielded {key!r} at epoch {number}: names that start with "
                f"{RESERVED_PREFIX!r} are the project's own; rename the metric"
            )


def _check_generator(epochs: Any) -> None:
    """Refuses what a trainable returned instead of yielding: a trainable is a generator.

    Raises:
        ConfigError: One line saying what came back and what to write instead.

    Example:
        >>> _check_generator({"val_loss": 0.3})
        Traceback (most recent call last):
        ...
        search.contract.context.ConfigError: the trainable returned a dict instead of ...
    """
    if isinstance(epochs, Mapping):
        raise ConfigError(
            "the trainable returned a dict instead of yielding one per epoch: write "
            "`yield {...}` inside the epoch loop (a trainable is a generator)"
        )
    if not isinstance(epochs, Iterable):
        raise ConfigError(
            f"the trainable returned a {type(epochs).__name__}, not a generator: yield one dict "
            "of metrics per epoch (a trainable is a generator)"
        )


@dataclass(frozen=True)
class Trained:
    """What :func:`train_to_end` gives an export hook.

    Args:
        model: What the trainable returned at its end (its model, or whatever it chose).
        metrics: The last epoch's metrics.
        epochs: How many epochs it trained.
    """

    model: Any
    metrics: Metrics
    epochs: int


class NoModelError(SearchError, RuntimeError):
    """The trainable's generator returned ``None``: an export hook has no model to save."""


def no_model(train: Any) -> str:
    """The one line for a trainable that returned no model.

    Example:
        >>> from search.testing import curve
        >>> no_model(curve).split(": end it")[0]
        'trainable search.testing.trainables:curve returned no model'
    """
    fn = inspect.unwrap(train)
    name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"
    return f"trainable {name} returned no model: end it with `return model` so export can save it"


_PROBING: contextvars.ContextVar[bool] = contextvars.ContextVar("probing", default=False)
"""Set while :func:`returns_model` runs an export hook: :func:`train_to_end` trains nothing."""


class _Probed(BaseException):
    """What :func:`train_to_end` raises while probing: whether the trainable returned a
    model. A ``BaseException``, so a hook's ``except Exception`` lets it through."""

    def __init__(self, returned: bool | None) -> None:
        super().__init__(returned)
        self.returned = returned


def returns_model(
    export: Callable[..., Any], config: Mapping[str, Any], data: Any, ctx: TrialContext, out: Any
) -> bool | None:
    """Whether ``export``'s trainable ends with a model, known before anything trains.

    The hook runs with ``max_epochs=0``; when it calls :func:`train_to_end`, the trainable's
    generator runs to its ``return`` without an epoch (its loop is empty) and the hook stops
    there. ``None`` when nothing is known: the hook does not call :func:`train_to_end` (it
    needs no returned model), fails before, or the trainable yields with no epoch to train.

    Example:
        >>> def train(config, data, ctx):
        ...     for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
        ...         yield {"loss": 1 / epoch}
        >>> def export(config, data, ctx, out_dir):
        ...     return train_to_end(train, config, data, ctx).metrics
        >>> returns_model(export, {}, None, TrialContext(max_epochs=5), None)
        False
    """
    token = _PROBING.set(True)
    try:
        export(config, data, dataclasses.replace(ctx, max_epochs=0), out)
    except _Probed as probed:
        return probed.returned
    except Exception:
        return None
    finally:
        _PROBING.reset(token)
    return None


def _probe(train: TrainFn, config: Mapping[str, Any], data: Any, ctx: TrialContext) -> NoReturn:
    """:func:`train_to_end` while probing: runs the generator to its ``return`` and raises
    :class:`_Probed` with whether it returned something (``None`` when it yielded an epoch
    all the same: nothing is known)."""
    epochs = cast(Generator[Any, None, Any], train(config, data, ctx))
    try:
        next(epochs)
    except StopIteration as stop:
        raise _Probed(stop.value is not None) from None
    finally:
        epochs.close()
    raise _Probed(None)


def train_to_end(
    train: TrainFn, config: Mapping[str, Any], data: Dataset, ctx: TrialContext
) -> Trained:
    """Runs ``train`` through every epoch for an export hook and keeps what it returns.

    The trainable's generator ends with ``return model``; that object is
    :attr:`Trained.model`. Each epoch's metrics are appended to ``ctx.history`` when that is
    a list. Checkpointing is off: an export trains in one go.

    Raises:
        NoModelError: When the trainable returned nothing (``None``): one line.
        RuntimeError: When training failed (a non-finite metric).

    Example:
        >>> def train(config, data, ctx):
        ...     for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
        ...         yield {"loss": 1 / epoch}
        ...     return "the model"
        >>> trained = train_to_end(train, {}, None, TrialContext(max_epochs=2))
        >>> trained.model, trained.metrics, trained.epochs
        ('the model', {'loss': 0.5}, 2)
    """
    run_ctx = dataclasses.replace(ctx, checkpoint_dir=None, restore_dir=None, start_epoch=1)
    if _PROBING.get():
        _probe(train, config, data, run_ctx)
    returned: list[Any] = []

    def keep_return() -> Generator[Mapping[str, Any], None, None]:
        epochs = cast(Generator[Mapping[str, Any], None, Any], train(config, data, run_ctx))
        returned.append((yield from epochs))

    last: Metrics = {}
    epochs, failed = 0, None
    # One epoch past the budget, so that a trainable that ends on its own reaches its return.
    with closing(drive(keep_return(), ctx.max_epochs + 1)) as run:
        for epoch in run:
            if epoch.number > ctx.max_epochs:
                break
            last, epochs, failed = dict(epoch.metrics), epoch.number, epoch.fail_reason
            if ctx.history is not None:
                ctx.history.append(dict(epoch.metrics))
    if failed:
        raise RuntimeError(f"training failed: {failed}")
    if not returned or returned[0] is None:
        raise NoModelError(no_model(train))
    return Trained(returned[0], last, epochs)
