"""The PyTorch and TensorFlow twins see an image folder the same way: files, split, numbers.

A generated folder (3 classes x 10 PNGs of random pixels, each image unique) goes through both
frameworks' data paths (``trainables.{torch,tf}.data.load_data``, the route every trainable
takes); each validation image is traced back to its file by its pixels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # before TensorFlow: the other order segfaults here
pytest.importorskip("tensorflow")

from search.compute.limits import apply_limits  # noqa: E402
from search.contract import TrialContext, train_to_end  # noqa: E402
from search.contract.dataset import Dataset, image_folder  # noqa: E402
from trainables.tf import data as tf_data  # noqa: E402
from trainables.torch import data as torch_data  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.tf]

CLASSES, PER_CLASS, SIZE = 3, 10, 8
TOP = 200
"""Largest pixel value drawn: the scale is the training split's largest value, not 255."""

Folder = tuple[Path, dict[bytes, tuple[str, int]]]


@pytest.fixture(scope="module", autouse=True)
def _two_threads() -> None:
    apply_limits(TrialContext(max_epochs=1, num_threads=2))  # before any TF op


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Folder:
    """The folder, and each image's HWC uint8 bytes -> (its file, its label)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("folder")
    files: dict[bytes, tuple[str, int]] = {}
    for label in range(CLASSES):
        (root / f"class_{label}").mkdir()
        for i in range(PER_CLASS):
            pixels = rng.integers(0, TOP + 1, (SIZE, SIZE, 3), dtype=np.uint8)
            Image.fromarray(pixels, "RGB").save(root / f"class_{label}" / f"{i}.png")
            files[pixels.tobytes()] = (f"class_{label}/{i}.png", label)
    assert len(files) == CLASSES * PER_CLASS
    return root, files


def context(root: Path) -> TrialContext:
    """What the runner passes a trial of ``data: {name: image_folder}``."""
    return TrialContext(max_epochs=1, num_threads=2, data_path=str(root))


def folder_data(root: Path) -> Dataset:
    """What the driver loads for ``data: {name: image_folder}`` (the layout only)."""
    return image_folder(root, SIZE, val_fraction=0.3, split_seed=5)


def torch_images(x: torch.Tensor, scale: float) -> np.ndarray:
    """Scaled NCHW tensors back to the HWC uint8 images they were read from."""
    return np.rint(x.numpy() * scale).astype(np.uint8).transpose(0, 2, 3, 1)


def tf_images(ds: Any, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """An unbatched NHWC dataset as HWC uint8 images, and its labels."""
    pairs = list(ds.as_numpy_iterator())
    x = np.stack([image for image, _ in pairs])
    return np.rint(x * scale).astype(np.uint8), np.array([label for _, label in pairs])


def traced(images: np.ndarray, files: dict[bytes, tuple[str, int]]) -> list[tuple[str, int]]:
    """The file and label each image was read from."""
    return [files[image.tobytes()] for image in images]


@pytest.mark.parametrize("train_fraction", [1.0, 0.5])
def test_both_frameworks_get_the_same_files_split_subsample_and_scaling(
    folder: Folder, train_fraction: float
) -> None:
    root, files = folder
    data = folder_data(root)
    tensors = torch_data.load_data(data, context(root), train_fraction)
    splits = tf_data.load_data(data, context(root), train_fraction)

    assert tensors.scale == splits.scale  # the training split's largest value, for both
    assert tensors.num_classes == splits.num_classes == CLASSES
    tf_val, tf_val_labels = tf_images(splits.val, splits.scale)
    torch_val = traced(torch_images(tensors.x_val, tensors.scale), files)
    assert torch_val == traced(tf_val, files)  # the same validation files, in the same order
    assert [label for _, label in torch_val] == tensors.y_val.tolist() == tf_val_labels.tolist()
    assert np.bincount(tensors.y_val.numpy()).tolist() == [3] * CLASSES  # stratified, 30 %

    tf_train, tf_train_labels = tf_images(splits.train, splits.scale)
    torch_train = traced(torch_images(tensors.x_train, tensors.scale), files)
    assert len(torch_train) == splits.n_train == len(tf_train)
    assert len(torch_train) == (21 if train_fraction == 1.0 else 10)
    assert sorted(torch_train) == sorted(traced(tf_train, files))  # the same subsample
    assert set(torch_val).isdisjoint(torch_train)

    x_torch = tensors.x_train.numpy().transpose(0, 2, 3, 1).reshape(-1, 3)
    x_tf = np.stack([image for image, _ in splits.train.as_numpy_iterator()]).reshape(-1, 3)
    assert x_torch.max() == x_tf.max() == 1.0
    np.testing.assert_allclose(x_torch.mean(0), x_tf.mean(0), rtol=1e-5)
    np.testing.assert_allclose(x_torch.std(0), x_tf.std(0), rtol=1e-5)
    np.testing.assert_allclose(tensors.mean.numpy(), x_tf.mean(0), rtol=1e-5)


def test_both_cnns_hand_out_their_model_and_data_the_same_way(folder: Folder) -> None:
    from trainables.tf import cnn as tf_cnn
    from trainables.torch import cnn as torch_cnn

    root, _ = folder
    config = {"channels": 4, "train_fraction": 0.5}
    returned = {
        name: train_to_end(train, config, folder_data(root), context(root)).model
        for name, train in (("torch", torch_cnn.train), ("tf", tf_cnn.train))
    }
    (torch_model, tensors), (tf_model, splits) = returned["torch"], returned["tf"]
    assert isinstance(torch_model, torch.nn.Module)
    assert len(tensors.y_train) == splits.n_train == 10
    assert tuple(tf_model.input_shape) == (None, SIZE, SIZE, 3)
