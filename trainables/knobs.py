"""The knobs every built-in trainable reads, shared by the PyTorch and TensorFlow twins.

One definition for both frameworks keeps the names, defaults and choices identical: a space
written for ``torch_cnn`` runs as it is on ``tf_cnn``. Framework-free (no torch, no TF), so
the driver's knob check (:mod:`search.specs.knobs`) reads each built-in's knobs here
(``search.contract.registry.BUILTIN_KNOBS``) without importing its framework.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from search import ConfigError

COMMON_DEFAULTS: dict[str, Any] = {
    "lr": 1e-3,
    "batch_size": 64,
    "optimizer": "adam",
    "momentum": 0.0,  # sgd only (torch's and Keras' default)
    "weight_decay": 0.0,  # L2: coupled for sgd/adam, decoupled for adamw
    "l1": 0.0,  # L1 penalty on weight matrices/kernels (not biases), added to the loss
    "dropout": 0.0,
    "lr_scheduler": "none",
    "step_size": None,  # epochs between step decays; None -> max(1, max_epochs // 3)
    "gamma": 0.1,  # decay factor of step and plateau
    "early_stopping_patience": 0,  # epochs without val_loss improvement; 0 = off
    "early_stopping_min_delta": 0.0,
    "clip_norm": 0.0,  # 0/None = off
    "clip_value": 0.0,  # 0/None = off
    "precision": "fp32",
    "num_workers": 0,
    "pin_memory": False,
    "data_placement": "auto",  # PyTorch: the dataset on the trial's device or a host DataLoader
}
"""Knobs every trainable reads (PyTorch and TensorFlow alike), with their defaults."""

AUGMENT_DEFAULTS: dict[str, Any] = {"augment": 0.0, "hflip": False}
"""Knobs of the image trainables (augmentation strength in [0, 1], 0 = off)."""

CNN_DEFAULTS: dict[str, Any] = {
    **COMMON_DEFAULTS,
    **AUGMENT_DEFAULTS,
    "channels": 32,
    "train_fraction": 1.0,
}
"""Every knob ``torch_cnn`` and ``tf_cnn`` read, with its default."""

RESNET_DEFAULTS: dict[str, Any] = {
    **COMMON_DEFAULTS,
    **AUGMENT_DEFAULTS,
    "hflip": True,  # every class of the shapes data, and of CIFAR, is mirror-symmetric
    "crop": 2,  # random translation by up to this many pixels (edges reflected); 0 = off
    "width": 64,  # channels of the first stage; the later ones are 2x and 4x
    "depth": 2,  # convolutions per stage: one that pools, then residual ones
    "label_smoothing": 0.0,
    "train_fraction": 1.0,
    "compile": False,  # torch.compile the training step (graphs cached per process and on disk)
    "memory_format": "auto",  # channels_last (what measured faster on a GPU and a CPU alike)
}
"""Every knob ``torch_resnet`` reads, with its default."""

RNN_DEFAULTS: dict[str, Any] = {**COMMON_DEFAULTS, "cell": "gru", "hidden": 64}
"""Every knob ``torch_rnn`` reads, with its default."""

_TRANSFER: dict[str, Any] = {"freeze_backbone": True, "unfreeze_blocks": 0, "image_size": 32}

TORCH_TRANSFER_DEFAULTS: dict[str, Any] = {
    **COMMON_DEFAULTS,
    **AUGMENT_DEFAULTS,
    "backbone": "resnet18",
    "weights_path": None,
    **_TRANSFER,
}
"""Every knob ``torch_transfer`` reads, with its default."""

TF_TRANSFER_DEFAULTS: dict[str, Any] = {
    **COMMON_DEFAULTS,
    **AUGMENT_DEFAULTS,
    "backbone": "mobilenet_v3_small",
    "weights_path": "",
    **_TRANSFER,
}
"""Every knob ``tf_transfer`` reads, with its default."""

CHOICES: dict[str, tuple[str, ...]] = {
    "optimizer": ("sgd", "adam", "adamw"),
    "lr_scheduler": ("none", "step", "cosine", "plateau", "cyclic", "onecycle"),
    "precision": ("fp32", "bf16", "fp16"),
    "data_placement": ("auto", "device", "host"),
    "memory_format": ("auto", "channels_last", "contiguous"),
}

FUSED_PER_MEMBER: tuple[str, ...] = (
    "lr", "optimizer", "weight_decay", "momentum", "l1", "dropout", "clip_norm", "clip_value",
    "lr_scheduler", "step_size", "gamma", "early_stopping_patience",
    "early_stopping_min_delta", "label_smoothing", "augment", "hflip",
)  # fmt: skip
"""The knobs members of one fused array may differ in (``trainables/torch/fused_loop.py``);
every other knob fixes the array's shape. Here, framework-free, so the driver's
``fuse: auto`` reads which of a space's parameters split an array without importing torch."""

PLATEAU_PATIENCE = 2
"""Epochs without val_loss improvement before ``plateau`` multiplies the lr by ``gamma``."""

CYCLE_EPOCHS = 2
"""Half-period of ``cyclic`` in epochs: lr climbs from lr/10 to lr, then falls back."""


def _coerce(key: str, value: Any, default: Any) -> Any:
    """Casts ``value`` to the type of ``default`` (``None`` off-switches become 0)."""
    if value is None:
        return 0.0 if key in ("clip_norm", "clip_value") else default
    if isinstance(default, bool):
        return bool(value)
    if isinstance(default, int):
        return int(value)
    if isinstance(default, float):
        return float(value)
    if isinstance(default, str):
        return str(value)
    return value


def read_config(
    config: Mapping[str, Any],
    defaults: Mapping[str, Any],
    choices: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, Any]:
    """Fills defaults into ``config``, casts types and checks the named choices.

    Args:
        config: The trial's parameters (sampled and fixed).
        defaults: Every key the trainable reads and its default (``COMMON_DEFAULTS`` and more).
        choices: Allowed string values per key, in addition to :data:`CHOICES`.

    Returns:
        A new dict with every key of ``defaults``.

    Raises:
        ValueError: On an unknown key or a value outside its choices.
    """
    unknown = sorted(set(config) - set(defaults))
    if unknown:
        raise ConfigError(f"unknown config key(s) {unknown}; known: {sorted(defaults)}")
    cfg = {k: _coerce(k, config.get(k, default), default) for k, default in defaults.items()}
    for key, allowed in {**CHOICES, **(choices or {})}.items():
        if key in cfg and cfg[key] not in allowed:
            raise ConfigError(f"{key} must be one of {', '.join(allowed)}, got {cfg[key]!r}")
    return cfg
