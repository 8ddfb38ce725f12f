"""A ResNet-style convnet for CIFAR-sized images (``torch_resnet``), in the way of airbench.

airbench (KellerJordan/cifar10-airbench) trains CIFAR-10 to 94 % in seconds on one GPU with
a small, wide, shallow net: a stem, three stages that each convolve, max-pool and normalize,
and a max-pooled linear head; the data on the GPU, batches cropped and flipped there. This
trainable keeps that shape, with residual convolutions when ``depth`` asks for more than one
per stage, and takes the speed levers as knobs:

    width            channels of the first stage (default 64); stages are w, 2w and 4w
    depth            convolutions per stage (default 2): one that pools, then residual ones
    crop, hflip      random translation by up to ``crop`` pixels, mirror (default 2, true)
    label_smoothing  of the cross-entropy (default 0)
    compile          torch.compile the training step (default false): the graph is reused by
                     the next trials of the same shape in the process, and its kernels by
                     other processes through the on-disk cache (:func:`trainables.torch.common.
                     compiled`)
    memory_format    ``channels_last`` (the convolutions' fast layout on tensor-core GPUs,
                     and on a CPU's oneDNN), ``contiguous``, or ``auto`` (channels_last)
    data_placement   ``device``: the dataset on the trial's device once per process, batches
                     shuffled, cropped and flipped there (:mod:`trainables.torch.device_data`);
                     ``host``: a ``DataLoader`` (``num_workers``, ``pin_memory``); ``auto``

and the shared ones (lr, optimizer, schedule, precision: ``bf16`` autocasts, ...). The
building blocks (:func:`conv_bn`, :class:`Residual`, :func:`stage`, :func:`build_model`) are
plain functions of their sizes, for other trainables to reuse.

Data: the built-in ``shapes`` (32x32x3, generated in code), an image folder, or any dataset
of images (:func:`trainables.torch.device_data.trial_data`).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

import torch
from torch import nn

from search import Dataset, Metrics, TrialContext, trainable
from trainables.knobs import RESNET_DEFAULTS
from trainables.torch.common import memory_format, setup
from trainables.torch.data import Standardize, Tensors
from trainables.torch.device_data import trial_data
from trainables.torch.export import make_exporter
from trainables.torch.loop import Fitted, fit_epochs

DEFAULTS: dict[str, Any] = RESNET_DEFAULTS  # framework-free: the driver reads them there
"""Every key :func:`train` reads, with its default."""


def conv_bn(c_in: int, c_out: int, pool: bool = False) -> nn.Sequential:
    """A 3x3 convolution (no bias), optionally a 2x2 max pool, batch norm and GELU."""
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)]
    if pool:
        layers.append(nn.MaxPool2d(2))
    layers += [nn.BatchNorm2d(c_out), nn.GELU()]
    return nn.Sequential(*layers)


class Residual(nn.Module):
    """``x + block(x)``."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


def stage(c_in: int, c_out: int, depth: int) -> nn.Sequential:
    """One stage: a convolution that pools to half the size, then ``depth - 1`` residual
    convolutions at ``c_out`` channels."""
    blocks: list[nn.Module] = [conv_bn(c_in, c_out, pool=True)]
    blocks += [Residual(conv_bn(c_out, c_out)) for _ in range(max(0, depth - 1))]
    return nn.Sequential(*blocks)


def build_model(cfg: Mapping[str, Any], tensors: Tensors) -> nn.Module:
    """Standardize, a stem at ``width / 2``, three stages (w, 2w, 4w channels; each halves
    the size), a global max pool, dropout and a linear head.

    Example:
        >>> import torch
        >>> from trainables.torch.data import Tensors
        >>> z = torch.zeros(2, 3, 32, 32)
        >>> t = Tensors(z, torch.zeros(2).long(), z, torch.zeros(2).long(),
        ...             torch.zeros(3), torch.ones(3), 10, 1.0)
        >>> build_model({"width": 8, "depth": 2, "dropout": 0.0}, t)(z).shape
        torch.Size([2, 10])
    """
    w, depth = int(cfg["width"]), int(cfg["depth"])
    if w < 2 or depth < 1:
        from search import ConfigError

        raise ConfigError(f"width must be at least 2 and depth at least 1, got {w} and {depth}")
    in_channels = tensors.x_train.shape[1]
    stem = max(1, w // 2)
    return nn.Sequential(
        Standardize(tensors.mean, tensors.std),
        conv_bn(in_channels, stem),
        stage(stem, w, depth),
        stage(w, 2 * w, depth),
        stage(2 * w, 4 * w, depth),
        nn.AdaptiveMaxPool2d(1),
        nn.Flatten(),
        nn.Dropout(float(cfg.get("dropout", 0.0))),
        nn.Linear(4 * w, tensors.num_classes, bias=False),
    )


# data_parallel: DDP when a trial has several workers (search.compute.distributed).
@trainable(defaults=DEFAULTS, data_parallel=True)
def train(
    config: Mapping[str, Any], data: Dataset, ctx: TrialContext
) -> Generator[Metrics, None, Fitted]:
    """The ``torch_resnet`` trainable: one metrics dict per epoch (:mod:`trainables.torch.loop`)."""
    cfg, device = setup(config, DEFAULTS, ctx)
    layout = memory_format(cfg, device)
    tensors = trial_data(data, cfg, ctx, device, cfg["train_fraction"], layout)
    model = build_model(cfg, tensors).to(memory_format=layout)
    return (yield from fit_epochs(model, tensors, cfg, ctx, device))


export = train.exporter(make_exporter(train))
"""The export hook: ``model.safetensors``, checked ONNX (:mod:`trainables.torch.export`)."""
