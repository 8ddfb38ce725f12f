"""The trainable contract: what a training function receives and what it yields.

A trainable is a plain generator function, independent of Ray and Optuna::

    def train(config: dict, data: Dataset, ctx: TrialContext) -> Iterator[dict[str, float]]:
        model = build(config)
        for epoch in range(1, ctx.max_epochs + 1):
            ...
            yield {"val_accuracy": acc, "val_loss": loss, "train_loss": tl}

It yields one metrics dict per epoch it trained. The runner turns each yield into one Ray Tune
report; when ASHA stops the trial, the generator is simply closed. A trainable that stops early
on its own rule just returns. Keys that start with :data:`RESERVED_PREFIX` belong to the
framework and must not be yielded.

Built-in trainables are named in :data:`BUILTIN` and imported only when used, so a PyTorch run
never imports TensorFlow. A user's own trainable is named ``package.module:function``.

Optional export hook (``python -m search export``): next to ``train``, a module may define::

    def export(config: dict, data: Dataset, ctx: TrialContext, out_dir: Path) -> dict[str, float]:
        ...  # train exactly as ``train`` does (to the end), then save the model into out_dir

It returns the final metrics (at least the objective's), saves the model in its framework's
formats (``model.safetensors`` and ``model.onnx``, or ``model.keras`` and a SavedModel), and,
when ``ctx.extras["history"]`` is a list, appends each epoch's metrics dict to it (the model
card plots them). :func:`resolve_exporter` finds it: ``<function>_export`` in the trainable's
module, or ``export`` when the function is named ``train``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from search.data import Dataset

RESERVED_PREFIX = "search/"
"""Prefix of the framework's own keys in configs and reported results."""

Metrics = dict[str, float]
TrainFn = Callable[[Mapping[str, Any], "Dataset", "TrialContext"], Iterator[Metrics]]
ExportFn = Callable[[Mapping[str, Any], "Dataset", "TrialContext", Path], Metrics]

BUILTIN: dict[str, str] = {
    "torch_cnn": "trainables.torch_cnn:train",
    "torch_rnn": "trainables.torch_rnn:train",
    "torch_transfer": "trainables.torch_transfer:train",
    "tf_cnn": "trainables.tf_cnn:train",
    "tf_transfer": "trainables.tf_transfer:train",
}
"""Registry of built-in trainables: name -> ``module:function``, imported lazily."""


@dataclass(frozen=True)
class TrialContext:
    """What the framework tells a trainable about the trial it runs.

    Args:
        max_epochs: The most epochs the trial may train (the study's budget).
        seed: Seed for every random generator of this trial.
        num_threads: CPU threads the trial may use (its share of the machine).
        device: ``"cuda"`` when Ray gave the trial a GPU, else ``"cpu"``.
        trial_number: The Optuna trial number (0 for a run outside a study).
        trial_dir: A folder the trial may write into (profiles, artifacts).
        extras: Spec-level options a trainable may read (for example ``profile``).
        checkpoint_dir: When set, a folder the trainable should write its state into (model,
            optimizer, scheduler; overwriting) just before each ``yield``. The framework turns
            it into that epoch's Ray Tune checkpoint. A trainable that writes nothing simply
            restarts from scratch when its trial is retried.
        restore_dir: When set, the trial is being retried: load the state saved there and
            continue with the epoch after ``start_epoch - 1``.
        start_epoch: The number of the first epoch this call yields (1, or later on restore).
    """

    max_epochs: int
    seed: int = 0
    num_threads: int = 1
    device: str = "cpu"
    trial_number: int = 0
    trial_dir: str = "."
    extras: Mapping[str, Any] = field(default_factory=dict)
    checkpoint_dir: str | None = None
    restore_dir: str | None = None
    start_epoch: int = 1


class UnknownTrainableError(ValueError):
    """The spec names a trainable that is neither built in nor importable."""


def check_trainable(name: str) -> None:
    """Checks, without importing it, that ``name`` can be resolved.

    Raises:
        UnknownTrainableError: When ``name`` is not built in and not an importable
            ``module:function`` path.
    """
    if name in BUILTIN:
        return
    module, sep, func = name.partition(":")
    if not sep or not module or not func.isidentifier():
        known = ", ".join(sorted(BUILTIN))
        raise UnknownTrainableError(
            f"unknown trainable {name!r}: expected one of {known} or 'package.module:function'"
        )
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise UnknownTrainableError(f"trainable module {module!r} cannot be imported")


def resolve_trainable(name: str) -> TrainFn:
    """Imports and returns the training function that ``name`` designates.

    Example:
        >>> fn = resolve_trainable("search.testing:curve")
        >>> callable(fn)
        True
    """
    check_trainable(name)
    target = BUILTIN.get(name, name)
    module_name, _, func_name = target.partition(":")
    module = importlib.import_module(module_name)
    try:
        fn: TrainFn = getattr(module, func_name)
    except AttributeError:
        raise UnknownTrainableError(
            f"trainable {name!r}: module {module_name!r} has no function {func_name!r}"
        ) from None
    return fn


def resolve_exporter(name: str) -> ExportFn | None:
    """The export hook next to the trainable ``name`` designates, or ``None`` when it has none.

    The hook of ``module:train`` is ``module:export``; that of ``module:fn`` (a module holding
    several trainables) is ``module:fn_export``. Its contract is in this module's docstring.

    Example:
        >>> resolve_exporter("search.testing:instant") is None
        True
    """
    check_trainable(name)
    module_name, _, func_name = BUILTIN.get(name, name).partition(":")
    module = importlib.import_module(module_name)
    names = [f"{func_name}_export"] + (["export"] if func_name == "train" else [])
    for candidate in names:
        fn = getattr(module, candidate, None)
        if callable(fn):
            return fn  # type: ignore[no-any-return]
    return None


def train_to_end(
    train: TrainFn, config: Mapping[str, Any], data: Dataset, ctx: TrialContext
) -> tuple[dict[str, Any], Metrics, int]:
    """Runs ``train`` through every epoch for an export, capturing the model it exposes.

    The trainable hands its model out through ``ctx.extras["model_out"]`` (a dict it fills);
    each epoch's metrics are appended to ``ctx.extras["history"]`` when that is a list.
    Checkpointing is off: an export trains in one go.

    Returns:
        The filled ``model_out`` dict, the last epoch's metrics, and the epochs trained.

    Raises:
        RuntimeError: When the trainable did not expose its model.
    """
    import dataclasses

    handle: dict[str, Any] = {}
    history = ctx.extras.get("history")
    run_ctx = dataclasses.replace(
        ctx, extras={**ctx.extras, "model_out": handle},
        checkpoint_dir=None, restore_dir=None, start_epoch=1,
    )
    last: Metrics = {}
    epochs = 0
    for metrics in train(config, data, run_ctx):
        last, epochs = dict(metrics), epochs + 1
        if isinstance(history, list):
            history.append(dict(metrics))
    if "model" not in handle:
        raise RuntimeError("the trainable did not expose its model (ctx.extras['model_out'])")
    return handle, last, epochs
