"""The built-ins' loop around a user's model (:func:`search.pytorch.sequential`).

Example (the digits, a model of four layers, one epoch):
    >>> from torch import nn
    >>> from search import TrialContext, load_digits
    >>> from trainables.knobs import CNN_DEFAULTS
    >>> def build(cfg, tensors):
    ...     return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    >>> epochs = fit_sequential(build, {"lr": 1e-2}, CNN_DEFAULTS, load_digits(0.2, 0),
    ...                         TrialContext(max_epochs=1))
    >>> 0 < next(epochs)["val_accuracy"] <= 1
    True
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any

from torch import nn

from search import Dataset, Metrics, TrialContext
from trainables.torch.common import setup
from trainables.torch.device_data import trial_data
from trainables.torch.loop import Fitted, fit_epochs


def fit_sequential(
    build: Callable[[Mapping[str, Any], Any], nn.Module],
    config: Mapping[str, Any],
    defaults: Mapping[str, Any],
    data: Dataset,
    ctx: TrialContext,
) -> Generator[Metrics, None, Fitted]:
    """The ``torch_cnn`` trainable's lines with the user's ``build`` in place of its model."""
    cfg, device = setup(config, defaults, ctx)
    tensors = trial_data(data, cfg, ctx, device, cfg["train_fraction"])
    model = build(cfg, tensors)
    return (yield from fit_epochs(model, tensors, cfg, ctx, device))
