"""The data a trainable receives (:class:`Dataset`) and the built-in datasets.

The driver loads a dataset once and shares it with every trial through Ray's object store.

Data is framework-neutral: numpy arrays, split into training and validation parts. Each
trainable turns them into tensors of its own framework (and normalizes them from the training
split, so no validation statistics leak into training).

An image folder is the exception: the driver only records its layout (:func:`image_folder`)
and every trial reads it itself, the same way in every framework (:func:`materialize`):
Pillow, RGB, resized to ``image_size``, NCHW float32 holding the pixel values 0..255, split by
:func:`split` with the spec's ``val_fraction`` and ``split_seed``. A trainable then treats
those arrays exactly as the digits (the built-ins subsample them for ``train_fraction``, then
divide by the training split's largest value).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from search.contract.shapes import CLASSES, generate


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
        path: For folder datasets, the absolute folder (arrays are then empty and each trial
            reads the folder with :func:`materialize`).
        image_size: For folder datasets, the side images are resized to.
        val_fraction: For folder datasets, the share of images that validate.
        split_seed: For folder datasets, the seed of the training/validation split.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int
    name: str
    path: str | None = None
    image_size: int | None = None
    val_fraction: float = 0.2
    split_seed: int = 0

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


SHAPES_SAMPLES = 12_000
"""Images of the ``shapes`` dataset when the spec gives no ``samples``."""
SHAPES_DIFFICULTY = 0.5
"""Its ``difficulty`` when the spec gives none."""


def load_shapes(
    val_fraction: float,
    seed: int,
    samples: int | None = None,
    difficulty: float | None = None,
    image_size: int | None = None,
) -> Dataset:
    """The ``shapes`` dataset: 10 classes of shapes in RGB images generated in code
    (:mod:`search.contract.shapes`: CIFAR-sized by default, 32x32x3, pixel values 0..255),
    split like the digits.

    Example:
        >>> data = load_shapes(0.2, 0, samples=50, image_size=16)
        >>> data.input_shape, len(data.y_train), len(data.y_val), data.num_classes
        ((3, 16, 16), 40, 10, 10)
    """
    x, y = generate(
        samples or SHAPES_SAMPLES,
        SHAPES_DIFFICULTY if difficulty is None else difficulty,
        image_size or 32,
    )
    x_tr, y_tr, x_va, y_va = split(x, y, val_fraction, seed)
    return Dataset(
        x_tr,
        y_tr,
        x_va,
        y_va,
        len(CLASSES),
        "shapes",
        val_fraction=val_fraction,
        split_seed=seed,
        image_size=image_size or 32,
    )


# --- image folders ----------------------------------------------------------------------------

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif"}


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES and path.is_file()


def folder_classes(root: Path) -> list[str]:
    """The subfolders of ``root`` with at least one image (at any depth), sorted by name."""
    return sorted(
        d.name for d in root.iterdir() if d.is_dir() and any(map(_is_image, d.rglob("*")))
    )


def image_folder(
    path: str | Path, image_size: int | None, val_fraction: float = 0.2, split_seed: int = 0
) -> Dataset:
    """A folder of class subfolders; only its layout is read here, never the images.

    Raises:
        FileNotFoundError: When the folder is missing or has no class subfolder with images.
    """
    root = Path(path).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"data.path: no folder at {root}")
    classes = folder_classes(root)
    if not classes:
        raise FileNotFoundError(f"data.path: {root} has no class subfolders with images")
    empty = np.zeros((0, 3, image_size or 32, image_size or 32), np.float32)
    labels = np.zeros((0,), np.int64)
    size = image_size or 32
    return Dataset(
        empty,
        labels,
        empty,
        labels,
        len(classes),
        "image_folder",
        str(root),
        size,
        val_fraction,
        split_seed,
    )


def folder_files(path: str | Path) -> tuple[list[Path], np.ndarray, list[str]]:
    """Every image of a class-subfolder tree (sorted), its label, and the class names.

    Raises:
        FileNotFoundError: When the folder is missing or has no class subfolder with images.
    """
    root = Path(path)
    classes = folder_classes(root) if root.is_dir() else []
    if not classes:
        raise FileNotFoundError(f"data.path: {root} has no class subfolders with images")
    files: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        found = sorted(filter(_is_image, (root / name).rglob("*")))
        files += found
        labels += [label] * len(found)
    return files, np.asarray(labels, dtype=np.int64), classes


def read_image(path: Path, image_size: int) -> np.ndarray:
    """One image as ``(3, image_size, image_size)`` float32 RGB, values 0..255 (bilinear)."""
    from PIL import Image

    with Image.open(path) as image:
        rgb = image.convert("RGB").resize((image_size, image_size), Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.float32).transpose(2, 0, 1).copy()


def read_image_folder(path: str | Path, image_size: int, val_fraction: float, seed: int) -> Dataset:
    """Reads a class-subfolder tree into arrays and splits it with :func:`split`.

    Every framework reads folders through here, so the same files go to validation and the
    inputs are the same numbers (NCHW float32 RGB, 0..255, ``image_size`` squares).
    """
    files, y, classes = folder_files(path)
    x = np.stack([read_image(f, image_size) for f in files])
    x_tr, y_tr, x_va, y_va = split(x, y, val_fraction, seed)
    return Dataset(
        x_tr,
        y_tr,
        x_va,
        y_va,
        len(classes),
        "image_folder",
        str(path),
        image_size,
        val_fraction,
        seed,
    )


def materialize(data: Dataset, path: str | None = None) -> Dataset:
    """The arrays a trial trains on: ``data`` itself, or the image folder it names, read now.

    The folder is ``path`` (a trial passes ``ctx.data_path``) or else ``data.path``, read at
    ``data.image_size`` (default 32) and split with ``data.val_fraction`` and
    ``data.split_seed``. Trainables call it inside the trial, so the driver never holds the
    images.
    """
    folder = path or data.path
    if not folder:
        return data
    size = int(data.image_size or 32)
    return read_image_folder(str(folder), size, data.val_fraction, data.split_seed)
