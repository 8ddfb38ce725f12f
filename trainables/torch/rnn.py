"""A recurrent network that reads each image row by row (the ``torch_rnn`` trainable).

The guide's exploding-gradient scenario: the 8 rows are a sequence of 8 features each, fed
unnormalized (pixel values 0..16, as the data comes) into a GRU or LSTM, whose last hidden
state goes through a dense LeakyReLU layer to the classifier. With plain SGD, no clipping and a
high learning rate the weights of the dense layers grow each other geometrically and the loss
overflows to inf/NaN within a few epochs (benchmarks/RESULTS.md gives the learning rates;
a low one trains). The same runs with ``clip_norm: 1.0`` stay finite. (The recurrent cell alone
cannot overflow: its gates saturate; the unbounded dense path is what explodes.)

Image folders work too (:func:`trainables.torch.data.load_data`): each row of the RGB image is
one time step of ``width * 3`` features, fed as unnormalized as the digits (0..255).

Config keys (all optional): the shared ones of
:data:`~trainables.torch.common.COMMON_DEFAULTS`, and:

    cell     gru | lstm (default gru)
    hidden   hidden units of the recurrent layer (default 64)
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from search import Dataset, Metrics, TrialContext, trainable
from trainables.knobs import RNN_DEFAULTS
from trainables.torch.common import setup
from trainables.torch.device_data import trial_data
from trainables.torch.export import make_exporter
from trainables.torch.loop import Fitted, fit_epochs

DEFAULTS: dict[str, Any] = RNN_DEFAULTS  # framework-free: the driver reads them there
"""Every key :func:`train` reads, with its default."""
CELL_CHOICES = {"cell": ("gru", "lstm")}


class RowReader(nn.Module):
    """GRU/LSTM over the image rows; last hidden state -> dense LeakyReLU -> classifier.

    Each row is one time step of ``features = width * channels`` values (pixel by pixel,
    channels interleaved), multiplied back by ``input_scale`` to the data's own range.
    """

    def __init__(
        self,
        cell: str,
        features: int,
        hidden: int,
        dropout: float,
        num_classes: int,
        input_scale: float,
    ) -> None:
        super().__init__()
        recurrent = nn.GRU if cell == "gru" else nn.LSTM
        self.rnn = recurrent(features, hidden, batch_first=True)
        self.head = nn.Sequential(
            nn.Linear(hidden, hidden),
            nn.LeakyReLU(0.1),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )
        self.input_scale = input_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.permute(0, 2, 3, 1).flatten(2) * self.input_scale  # (B, H, W*C): a row a step
        # oneDNN's bf16 LSTM fails on CPUs without native bf16: the cell runs in fp32 on CPU.
        with torch.autocast("cpu", enabled=False) if x.device.type == "cpu" else nullcontext():
            out, _ = self.rnn(seq.float() if x.device.type == "cpu" else seq)
        return self.head(out[:, -1])


# data_parallel: DDP when a trial has several workers (search.compute.distributed).
@trainable(defaults=DEFAULTS, data_parallel=True)
def train(
    config: Mapping[str, Any], data: Dataset, ctx: TrialContext
) -> Generator[Metrics, None, Fitted]:
    """The ``torch_rnn`` trainable: one metrics dict per epoch (:mod:`trainables.torch.loop`)."""
    cfg, device = setup(config, DEFAULTS, ctx, CELL_CHOICES)
    tensors = trial_data(data, cfg, ctx, device)
    channels, _, width = tensors.x_train.shape[1:]
    model = RowReader(
        cfg["cell"],
        width * channels,
        cfg["hidden"],
        cfg["dropout"],
        tensors.num_classes,
        input_scale=tensors.scale,
    )
    return (yield from fit_epochs(model, tensors, cfg, ctx, device))


export = train.exporter(make_exporter(train))
"""The export hook: ``model.safetensors``, checked ONNX (:mod:`trainables.torch.export`)."""
