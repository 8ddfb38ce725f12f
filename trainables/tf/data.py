"""From the framework's numpy :class:`~search.contract.Dataset` (or an image folder) to tf.data.

Images become NHWC float32 in [0, 1] (scaled by the training split's largest value, 16 for
the digits); standardization is a model layer adapted on the training split only
(``_tf_common.normalization``), so validation never leaks into the statistics. The twin of
``trainables.torch.data``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from search.contract.dataset import Dataset
from search.contract import TrialContext


@dataclass(frozen=True)
class Splits:
    """Unbatched ``(image HWC float32 in [0, 1], int label)`` datasets, training and validation."""

    train: tf.data.Dataset
    val: tf.data.Dataset
    n_train: int
    input_shape: tuple[int, int, int]
    num_classes: int


def subsample(data: Dataset, fraction: float, seed: int = 0) -> Dataset:
    """``data`` with a stratified ``fraction`` of its training split, the same in every trial."""
    if fraction >= 1.0 or len(data.y_train) == 0:
        return data
    from sklearn.model_selection import train_test_split

    n_keep = max(data.num_classes, round(fraction * len(data.y_train)))
    x, _, y, _ = train_test_split(data.x_train, data.y_train, train_size=n_keep,
                                  random_state=seed, stratify=data.y_train)
    return dataclasses.replace(data, x_train=x, y_train=y)


def from_arrays(data: Dataset) -> Splits:
    """The framework's ``(n, C, H, W)`` arrays as NHWC datasets, scaled by the training max."""
    scale = float(max(data.x_train.max(), 1e-8))

    def images(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1), dtype=np.float32) / scale

    x_train, x_val = images(data.x_train), images(data.x_val)
    return Splits(
        train=tf.data.Dataset.from_tensor_slices((x_train, data.y_train.astype(np.int32))),
        val=tf.data.Dataset.from_tensor_slices((x_val, data.y_val.astype(np.int32))),
        n_train=len(x_train),
        input_shape=tuple(x_train.shape[1:]),
        num_classes=int(data.num_classes),
    )


def load_image_folder(path: str, val_fraction: float, seed: int, image_size: int) -> Splits:
    """Images in one subfolder per class, split reproducibly and resized to ``image_size``.

    Args:
        path: Folder with a subfolder per class (``path/<class>/*.png``, jpg, bmp, gif).
        val_fraction: Share of the files that go to validation.
        seed: Seed of the split (the same files go to validation in every trial).
        image_size: Height and width the images are resized to.
    """
    train, val = keras.utils.image_dataset_from_directory(
        path, validation_split=val_fraction, subset="both", seed=seed,
        image_size=(image_size, image_size), batch_size=None, color_mode="rgb",
    )
    num_classes = len(train.class_names)

    def scaled(ds: tf.data.Dataset) -> tf.data.Dataset:
        return ds.map(lambda x, y: (x / 255.0, y), num_parallel_calls=tf.data.AUTOTUNE)

    n_train = int(train.cardinality())
    return Splits(scaled(train), scaled(val), n_train, (image_size, image_size, 3), num_classes)


def load_splits(data: Dataset, ctx: TrialContext, image_size: int | None = None) -> Splits:
    """An image folder when ``ctx.extras["data_path"]`` is set, else the arrays of ``data``.

    Folder options come from ``ctx.extras`` too: ``val_fraction`` (0.2), ``split_seed`` (0),
    ``image_size`` (32, or the trainable's own ``image_size``).
    """
    path = ctx.extras.get("data_path")
    if not path:
        return from_arrays(data)
    size = int(image_size or ctx.extras.get("image_size", 32))
    val_fraction = float(ctx.extras.get("val_fraction", 0.2))
    return load_image_folder(str(path), val_fraction, int(ctx.extras.get("split_seed", 0)), size)


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
