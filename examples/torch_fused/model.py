"""A PyTorch model of your own, trained by the framework's loop and fused: no training loop here.

``build`` returns the model; :func:`search.pytorch.sequential` makes it a trainable with every
knob of the built-ins (optimizer, schedule, clipping, precision, ...) plus ``hidden``. With
``resources.fuse: 8`` in the spec, eight trials of one shape train as one model.

    python -m search run examples/torch_fused/space.yaml
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

import search.pytorch


def build(cfg: Mapping[str, Any], tensors: Any) -> nn.Sequential:
    """An MLP on the 8x8 digits: standardize, two hidden layers of ``hidden`` units."""
    features = tensors.x_train[0].numel()
    return nn.Sequential(
        search.pytorch.standardize(tensors),
        nn.Flatten(),
        nn.Linear(features, cfg["hidden"]),
        nn.ReLU(),
        nn.Dropout(cfg["dropout"]),
        nn.Linear(cfg["hidden"], cfg["hidden"]),
        nn.ReLU(),
        nn.Linear(cfg["hidden"], tensors.num_classes),
    )


train = search.pytorch.sequential(build, defaults={"hidden": 64})
