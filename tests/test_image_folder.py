"""`data: {name: image_folder}`: a PNG tree on disk, read in the trial by the one shared reader."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from search.contract import TrialContext, train_to_end
from search.contract.dataset import image_folder, load_digits, materialize
from search.record.study import load_study
from search.specs.schema import parse_spec
from search.tuning.runner import RunOptions, run_study
from tests.helpers import base_spec


@pytest.fixture(scope="module")
def png_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 class folders of upscaled digits, 16x16 PNGs, 16 images each."""
    from PIL import Image

    root = tmp_path_factory.mktemp("pngs")
    digits = load_digits(0.2, 0)
    counts = dict.fromkeys(range(10), 0)
    for image, label in zip(digits.x_train[:, 0], digits.y_train, strict=True):
        if counts[int(label)] >= 16:
            continue
        folder = root / f"digit_{label}"
        folder.mkdir(exist_ok=True)
        pixels = (image / 16.0 * 255).astype(np.uint8)
        Image.fromarray(pixels).resize((16, 16)).save(folder / f"{counts[int(label)]}.png")
        counts[int(label)] += 1
    return root


def test_layout_is_read_without_loading_images(png_tree: Path, tmp_path: Path) -> None:
    data = image_folder(png_tree, 16)
    assert data.num_classes == 10 and data.path == str(png_tree) and len(data.x_train) == 0
    with pytest.raises(FileNotFoundError, match="data.path"):
        image_folder(tmp_path / "absent", 16)


def test_the_folder_is_read_into_rgb_arrays_and_split_by_class(png_tree: Path) -> None:
    data = image_folder(png_tree, 16, val_fraction=0.25, split_seed=0)
    arrays = materialize(data)
    assert arrays.x_train.shape[1:] == (3, 16, 16) and arrays.x_train.dtype == np.float32
    assert len(arrays.x_train) + len(arrays.x_val) == 160 and len(arrays.x_val) == 40
    assert np.bincount(arrays.y_val).tolist() == [4] * 10  # stratified
    assert arrays.x_train.min() >= 0.0 and arrays.x_train.max() <= 255.0
    assert materialize(load_digits(0.2, 0)).name == "digits"  # arrays pass through
    moved = png_tree.parent / "moved"
    shutil.copytree(png_tree, moved)
    elsewhere = materialize(image_folder(moved, 8), path=str(png_tree))
    assert elsewhere.x_val.shape[1:] == (3, 8, 8)  # ctx.data_path wins over data.path
    assert elsewhere.path == str(png_tree)


@pytest.mark.torch
def test_torch_cnn_trains_on_the_folder(png_tree: Path) -> None:
    from trainables.torch import cnn as torch_cnn

    data = image_folder(png_tree, 16, val_fraction=0.25, split_seed=0)
    ctx = TrialContext(max_epochs=2)
    rows = list(torch_cnn.train({"channels": 8, "lr": 3e-3}, data, ctx))
    assert len(rows) == 2 and 0.0 <= rows[-1]["val_accuracy"] <= 1.0


@pytest.mark.torch
@pytest.mark.parametrize("name", ["rnn", "transfer"])
def test_torch_rnn_and_transfer_train_on_the_folder(name: str, png_tree: Path) -> None:
    # Both used to skip the folder reader: the empty arrays of image_folder failed every trial.
    from trainables.torch import rnn as torch_rnn
    from trainables.torch import transfer as torch_transfer

    train, config = {
        "rnn": (torch_rnn.train, {"hidden": 16}),
        "transfer": (torch_transfer.train, {"backbone": "mobilenet_v3_small", "image_size": 32}),
    }[name]
    rows: list[dict[str, float]] = []
    ctx = TrialContext(max_epochs=1, num_threads=1, data_path=str(png_tree), history=rows)
    _, tensors = train_to_end(train, config, image_folder(png_tree, 16), ctx).model
    assert len(rows) == 1 and np.isfinite(rows[0]["val_loss"])
    assert tensors.x_train.shape[1:] == (3, 16, 16)  # the folder's RGB images


@pytest.mark.torch
@pytest.mark.ray
@pytest.mark.slow
def test_a_study_on_an_image_folder_through_ray(
    ray_local: None, png_tree: Path, tmp_path: Path
) -> None:
    spec = parse_spec(
        base_spec(
            tmp_path,
            study="folder",
            trainable="torch_cnn",
            data={"name": "image_folder", "path": str(png_tree), "image_size": 16},
            budget={"trials": 2, "max_epochs": 2},
            fixed={"channels": 8},
            space={"lr": {"loguniform": [1e-3, 1e-2]}},
        )
    )
    run_study(spec, RunOptions(results_dir=tmp_path / "results", progress=False))
    trials = load_study("folder", spec.storage).trials
    assert len(trials) == 2 and all(t.state.name in ("COMPLETE", "PRUNED") for t in trials)
