"""Datasets the driver loads once and shares with every trial through Ray's object store.

Data is framework-neutral: numpy arrays, split into training and validation parts. Each
trainable turns them into tensors of its own framework (and normalizes them from the training
split, so no validation statistics leak into training).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from search.spec import DataSpec


@dataclass(frozen=True)
class Dataset:
    """A classification dataset split into training and validation arrays.

    Args:
        x_train: Inputs, shape ``(n, channels, height, width)`` for images, float32.
        y_train: Integer class labels, shape ``(n,)``.
        x_val: Validation inputs, same layout as ``x_train``.
        y_val: Validation labels.
        num_classes: How many classes the labels range over.
        name: The dataset's name in the spec.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int
    name: str

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input (without the batch dimension)."""
        return tuple(self.x_train.shape[1:])


def split(
    x: np.ndarray, y: np.ndarray, val_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Splits ``(x, y)`` into stratified training and validation parts, reproducibly."""
    from sklearn.model_selection import train_test_split

    x_tr, x_va, y_tr, y_va = train_test_split(
        x, y, test_size=val_fraction, random_state=seed, stratify=y
    )
    return x_tr, y_tr, x_va, y_va


def load_digits(val_fraction: float, seed: int) -> Dataset:
    """scikit-learn's 8x8 handwritten digits (1797 images, shipped with the package)."""
    from sklearn.datasets import load_digits as _load

    bunch = _load()
    x = bunch.images.astype(np.float32)[:, None, :, :]  # (n, 1, 8, 8), values 0..16
    y = bunch.target.astype(np.int64)
    x_tr, y_tr, x_va, y_va = split(x, y, val_fraction, seed)
    return Dataset(x_tr, y_tr, x_va, y_va, num_classes=10, name="digits")


LOADERS = {"digits": load_digits}
"""Built-in datasets by name."""


def load_data(spec: DataSpec) -> Dataset:
    """Loads the dataset that a validated :class:`~search.spec.DataSpec` names."""
    return LOADERS[spec.name](spec.val_fraction, spec.split_seed)
