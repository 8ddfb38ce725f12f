"""Datasets the driver loads once and shares with every trial through Ray's object store.

Data is framework-neutral: numpy arrays, split into training and validation parts. Each
trainable turns them into tensors of its own framework (and normalizes them from the training
split, so no validation statistics leak into training).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
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
        path: For folder datasets, the absolute folder (arrays are then empty and each
            trainable reads the folder with its framework's reader).
        image_size: For folder datasets, the side images are resized to.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int
    name: str
    path: str | None = None
    image_size: int | None = None

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


IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif"}


def image_folder(path: str | Path, image_size: int | None) -> Dataset:
    """A folder of class subfolders; only its layout is read here, never the images.

    Raises:
        FileNotFoundError: When the folder is missing or has no class subfolder with images.
    """
    root = Path(path).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"data.path: no folder at {root}")
    classes = sorted(
        d.name
        for d in root.iterdir()
        if d.is_dir() and any(f.suffix.lower() in IMAGE_SUFFIXES for f in d.iterdir())
    )
    if not classes:
        raise FileNotFoundError(f"data.path: {root} has no class subfolders with images")
    empty = np.zeros((0, 3, image_size or 32, image_size or 32), np.float32)
    labels = np.zeros((0,), np.int64)
    return Dataset(
        empty, labels, empty, labels, len(classes), "image_folder", str(root), image_size or 32
    )


def load_data(spec: DataSpec) -> Dataset:
    """Loads the dataset that a validated :class:`~search.spec.DataSpec` names."""
    if spec.name == "image_folder":
        return image_folder(spec.path or "", spec.image_size)
    return load_digits(spec.val_fraction, spec.split_seed)
