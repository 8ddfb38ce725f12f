"""Your PyTorch ``nn.Sequential`` trained by the built-ins' loop, and fused when the spec asks.

You write the model; the framework writes the training: the optimizer and its schedule,
clipping, L1/L2, early stopping, mixed precision, the data on the device, checkpoints, the
export hook (ONNX, checked), every knob of the built-ins (:data:`trainables.knobs.COMMON_DEFAULTS`).
Because the loop is the framework's, trials of your model can train as members of one fused
array (``resources.fuse: N``): your model must then be an ``nn.Sequential`` of ``Conv2d``,
``Linear``, ``ReLU``, ``GELU``, ``Tanh``, ``MaxPool2d``, ``Flatten``, ``Dropout`` and
:func:`standardize`. The data is the spec's images, ``(n, C, H, W)``::

    # mymodel.py
    import search.pytorch
    from torch import nn

    def build(cfg, tensors):           # tensors: the data as PyTorch sees it (mean, std, ...)
        return nn.Sequential(
            search.pytorch.standardize(tensors), nn.Flatten(),
            nn.Linear(tensors.x_train[0].numel(), cfg["hidden"]), nn.ReLU(),
            nn.Linear(cfg["hidden"], tensors.num_classes),
        )

    train = search.pytorch.sequential(build, defaults={"hidden": 64})

and ``trainable: mymodel:train`` in the spec (``examples/torch_fused``). Your own knobs go in
``defaults``, beside the built-ins' (a misspelled knob is refused, as for a built-in).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Generator, Mapping
from typing import Any

from search.contract import Dataset, Metrics, TrialContext, trainable

FUSE_BUILD = "fuse_build"
"""The attribute of a trainable made here: ``module:function`` of its model builder (what a
fused array builds each member with, :mod:`search.tuning.fusion`)."""


def sequential(
    build: Callable[[Mapping[str, Any], Any], Any], *, defaults: Mapping[str, Any] | None = None
) -> Any:
    """A trainable that trains ``build(cfg, tensors)`` (an ``nn.Sequential``) with the
    built-ins' loop and knobs plus ``defaults``; it exports like a built-in and fuses.

    Example:
        >>> def build(cfg, tensors): ...
        >>> train = sequential(build, defaults={"hidden": 64})
        >>> from search.contract.declare import declared
        >>> train.fuse_build, "lr" in declared(train).defaults, declared(train).export is not None
        ('search.pytorch:build', True, True)
    """
    knobs = {**importlib.import_module("trainables.knobs").CNN_DEFAULTS, **(defaults or {})}
    knobs.pop("channels")  # the built-in CNN's own

    @trainable(defaults=knobs, data_parallel=True)
    def train(
        config: Mapping[str, Any], data: Dataset, ctx: TrialContext
    ) -> Generator[Metrics, None, Any]:
        loop = importlib.import_module("trainables.torch.sequential")
        return (yield from loop.fit_sequential(build, config, knobs, data, ctx))

    def export(
        config: Mapping[str, Any], data: Dataset, ctx: TrialContext, out_dir: Any
    ) -> Metrics:
        """The built-ins' export hook (``trainables/torch/export.py``): ONNX, checked."""
        torch_export = importlib.import_module("trainables.torch.export")
        return dict(torch_export.export_torch(train, config, data, ctx, out_dir))

    train.exporter(export)
    setattr(train, FUSE_BUILD, f"{build.__module__}:{build.__qualname__}")
    return train


def standardize(tensors: Any) -> Any:
    """The layer that standardizes images with the training split's per-channel mean and std
    (``tensors.mean``, ``tensors.std``): put it first, and the exported model takes raw images."""
    data = importlib.import_module("trainables.torch.data")
    return data.Standardize(tensors.mean, tensors.std)
