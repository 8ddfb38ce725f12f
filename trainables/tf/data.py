"""From the framework's numpy :class:`~search.Dataset` to tf.data.

The twin of ``trainables.torch.data``: the same arrays (an image folder is read by
:func:`search.materialize` for both frameworks), the same stratified
``train_fraction`` subsample, the same scaling. Images become NHWC float32 in [0, 1], divided
by the training split's largest value (16 for the digits, 255 for most image folders);
standardization is a model layer adapted on the training split only
(:func:`trainables.tf.common.normalization`), so validation never leaks into the statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from search import Dataset, TrialContext, materialize
from trainables.fraction import subsample


@dataclass(frozen=True)
class Splits:
    """Unbatched ``(image HWC float32 in [0, 1], int label)`` datasets, training and validation.

    ``scale`` is what the inputs were divided by (the training split's largest value).
    """

    train: tf.data.Dataset
    val: tf.data.Dataset
    n_train: int
    input_shape: tuple[int, int, int]
    num_classes: int
    scale: float = 1.0


def load_data(data: Dataset, ctx: TrialContext, train_fraction: float = 1.0) -> Splits:
    """The trial's datasets: ``data``'s arrays or its image folder (read now, the same way
    in both frameworks: :func:`search.materialize`), subsampled and scaled
    (:func:`from_arrays`). The twin of ``trainables.torch.data.load_data``."""
    return from_arrays(subsample(materialize(data, ctx.data_path), train_fraction))


def from_arrays(data: Dataset) -> Splits:
    """The framework's ``(n, C, H, W)`` arrays as NHWC datasets, scaled by the training max."""
    scale = float(max(data.x_train.max(), 1e-8))

    def images(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1), dtype=np.float32) / scale

    x_train, x_val = images(data.x_train), images(data.x_val)
    height, width, channels = x_train.shape[1:]
    return Splits(
        train=tf.data.Dataset.from_tensor_slices((x_train, data.y_train.astype(np.int32))),
        val=tf.data.Dataset.from_tensor_slices((x_val, data.y_val.astype(np.int32))),
        n_train=len(x_train),
        input_shape=(int(height), int(width), int(channels)),
        num_classes=int(data.num_classes),
        scale=scale,
    )


def pipeline(
    ds: tf.data.Dataset, batch_size: int, num_threads: int, shuffle_seed: int | None = None
) -> tf.data.Dataset:
    """Cache, (shuffle,) batch and prefetch; tf.data's threads are capped at ``num_threads``.

    Args:
        ds: Unbatched ``(image, label)`` pairs.
        batch_size: Examples per batch.
        num_threads: Size of the dataset's private thread pool (the trial's CPU share).
        shuffle_seed: Reshuffle every epoch from this seed; ``None`` keeps the order.
    """
    ds = ds.cache()
    if shuffle_seed is not None:
        ds = ds.shuffle(10_000, seed=shuffle_seed, reshuffle_each_iteration=True)
    options = tf.data.Options()
    options.threading.private_threadpool_size = max(1, num_threads)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE).with_options(options)
