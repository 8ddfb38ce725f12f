"""The ``train_fraction`` knob: the same stratified share of the training split in both twins.

Framework-free (numpy and scikit-learn), so ``trainables.torch.data`` and ``trainables.tf.data``
subsample an identical set of examples.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from search import Dataset


def subsample(data: Dataset, fraction: float, seed: int = 0) -> Dataset:
    """``data`` with a stratified ``fraction`` of its training split, the same in every trial.

    At least one example of each class is kept; validation stays as it is.

    Raises:
        ValueError: When ``fraction`` is not in (0, 1].
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"train_fraction must be in (0, 1], got {fraction}")
    if fraction == 1.0 or len(data.y_train) == 0:
        return data
    from sklearn.model_selection import train_test_split

    n_keep = max(len(np.unique(data.y_train)), round(fraction * len(data.y_train)))
    x, _, y, _ = train_test_split(
        data.x_train, data.y_train, train_size=n_keep, random_state=seed, stratify=data.y_train
    )
    return dataclasses.replace(data, x_train=x, y_train=y)
