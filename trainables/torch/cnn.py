"""A small convolutional network for the 8x8 digits or an image folder (``torch_cnn``).

Config keys (all optional): the shared ones of
:data:`~trainables.torch.common.COMMON_DEFAULTS` (lr, batch_size, optimizer, momentum,
weight_decay, l1, dropout, lr_scheduler, step_size, gamma, early stopping, clipping, precision,
loader options), ``augment`` and ``hflip``, and:

    channels         width of the first conv layer (default 32; the later ones are 2x)
    train_fraction   stratified share of the training split to train on (default 1.0);
                     a small share with a wide model overfits (``spaces/overfit.yaml``)

At adam, lr 3e-3, batch 64 it passes 0.97 val_accuracy within about 10 epochs.

Data: the framework's arrays, or an image folder (:func:`trainables.torch.data.load_data`).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from torch import nn

from search import Dataset, Metrics, TrialContext, trainable
from trainables.knobs import CNN_DEFAULTS
from trainables.torch.common import setup
from trainables.torch.data import Standardize, Tensors
from trainables.torch.device_data import trial_data
from trainables.torch.export import make_exporter
from trainables.torch.loop import Fitted, fit_epochs

DEFAULTS: dict[str, Any] = CNN_DEFAULTS  # framework-free: the driver reads them there
"""Every key :func:`train` reads, with its default."""


def build_model(cfg: Mapping[str, Any], tensors: Tensors) -> nn.Module:
    """Standardize, two conv stages (c, then 2c channels) with max pooling, a dense head.

    No batch norm: with lr 0 the model is then exactly unchanged by training, which the
    tests use to show that augmentation never reaches validation.
    """
    c, p = cfg["channels"], cfg["dropout"]
    in_channels, height, width = tensors.x_train.shape[1:]
    flat = 2 * c * (height // 4) * (width // 4)
    return nn.Sequential(
        Standardize(tensors.mean, tensors.std),
        nn.Conv2d(in_channels, c, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(c, c, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c, 2 * c, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(p),
        nn.Linear(flat, 128),
        nn.ReLU(),
        nn.Dropout(p),
        nn.Linear(128, tensors.num_classes),
    )


# data_parallel: DDP when a trial has several workers (search.compute.distributed).
@trainable(defaults=DEFAULTS, data_parallel=True)
def train(
    config: Mapping[str, Any], data: Dataset, ctx: TrialContext
) -> Generator[Metrics, None, Fitted]:
    """The ``torch_cnn`` trainable: one metrics dict per epoch (:mod:`trainables.torch.loop`)."""
    cfg, device = setup(config, DEFAULTS, ctx)
    tensors = trial_data(data, cfg, ctx, device, cfg["train_fraction"])
    model = build_model(cfg, tensors)
    return (yield from fit_epochs(model, tensors, cfg, ctx, device))


export = train.exporter(make_exporter(train))
"""The export hook: ``model.safetensors``, checked ONNX (:mod:`trainables.torch.export`)."""
