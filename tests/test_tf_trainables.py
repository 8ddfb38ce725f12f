"""The TensorFlow/Keras trainables, for real: digits, a tiny image folder, a pretrained backbone.

Every trial runs on 2 CPU threads; most tests use a small subset of the digits, because the
first epoch of a Keras trial is mostly graph tracing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import keras  # noqa: E402

from search.compute.limits import apply_limits  # noqa: E402
from search.contract import RESERVED_PREFIX, TrialContext, train_to_end  # noqa: E402
from search.contract.dataset import Dataset, load_digits  # noqa: E402
from trainables.tf import cnn as tf_cnn  # noqa: E402
from trainables.tf import (
    common,  # noqa: E402
    loop,  # noqa: E402
)
from trainables.tf import data as tfdata  # noqa: E402
from trainables.tf import transfer as tf_transfer  # noqa: E402

pytestmark = pytest.mark.tf

KEYS = {"train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr"}


@pytest.fixture(scope="module", autouse=True)
def _two_threads() -> None:
    apply_limits(TrialContext(max_epochs=1, num_threads=2))  # before any TF op


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_digits(0.2, 0)


@pytest.fixture(scope="module")
def small(digits: Dataset) -> Dataset:
    """256 training and 64 validation digits: a few batches an epoch."""
    return Dataset(
        digits.x_train[:256],
        digits.y_train[:256],
        digits.x_val[:64],
        digits.y_val[:64],
        num_classes=10,
        name="digits-small",
    )


def run(
    train: Any, config: Mapping[str, Any], data: Dataset, max_epochs: int, **fields: Any
) -> tuple[list[dict[str, float]], keras.Model]:
    """All epochs of one trial, and the model its generator returns."""
    history: list[dict[str, float]] = []
    ctx = TrialContext(max_epochs=max_epochs, num_threads=2, history=history, **fields)
    model, _ = train_to_end(train, config, data, ctx).model
    return history, model


@pytest.fixture(scope="module")
def trained(digits: Dataset) -> tuple[list[dict[str, float]], keras.Model]:
    config = {"lr": 3e-3, "batch_size": 64, "optimizer": "adam", "clip_norm": 1.0}
    return run(tf_cnn.train, config, digits, max_epochs=6)


def test_cnn_yields_the_contract_keys_every_epoch(trained: Any) -> None:
    metrics, _ = trained
    assert len(metrics) == 6
    for m in metrics:
        assert set(m) >= KEYS
        assert not any(key.startswith(RESERVED_PREFIX) for key in m)
        assert all(isinstance(v, float) and math.isfinite(v) for v in m.values())


def test_cnn_learns_digits_in_a_handful_of_epochs(trained: Any) -> None:
    metrics, _ = trained
    assert metrics[-1]["val_accuracy"] >= 0.9
    assert metrics[-1]["train_loss"] < metrics[0]["train_loss"]


def test_clip_norm_is_set_on_the_optimizer(trained: Any) -> None:
    _, model = trained
    assert model.optimizer.global_clipnorm == 1.0  # torch's clip_grad_norm_: the global norm
    assert model.optimizer.clipvalue is None


def test_saved_model_reloads_with_the_same_val_accuracy(
    trained: Any, digits: Dataset, tmp_path: Path
) -> None:
    metrics, model = trained
    model.save(tmp_path / "cnn.keras")
    reloaded = keras.models.load_model(tmp_path / "cnn.keras")
    val = tfdata.pipeline(tfdata.from_arrays(digits).val, 64, 2)
    _, accuracy = reloaded.evaluate(val, verbose=0)
    assert accuracy == pytest.approx(metrics[-1]["val_accuracy"], abs=1e-6)


@pytest.mark.parametrize("scheduler", ["step", "cosine", "cyclic", "onecycle"])
def test_each_scheduler_runs(scheduler: str, small: Dataset) -> None:
    config = {"lr": 1e-2, "lr_scheduler": scheduler, "step_size": 1, "channels": 8}
    metrics, _ = run(tf_cnn.train, config, small, max_epochs=2)
    first, second = (m["lr"] for m in metrics)
    expected_first = {"step": 1e-2, "cosine": 1e-2, "cyclic": 1e-3, "onecycle": 1e-2 / 25}
    assert first == pytest.approx(expected_first[scheduler], rel=1e-4)
    if scheduler == "step":
        assert second == pytest.approx(1e-3, rel=1e-4)
    else:
        assert second != pytest.approx(first)


def test_plateau_lowers_lr_after_patience_across_per_epoch_fits(small: Dataset) -> None:
    config = {"lr": 1e-9, "lr_scheduler": "plateau", "gamma": 0.1, "channels": 8}
    metrics, _ = run(tf_cnn.train, config, small, max_epochs=5)
    lrs = [m["lr"] for m in metrics]
    # three epochs without improvement after the first (torch's patience 2 counts like this)
    assert lrs[:4] == pytest.approx([1e-9] * 4) and lrs[4] == pytest.approx(1e-10)


def test_early_stopping_returns_before_max_epochs(small: Dataset) -> None:
    config = {"lr": 0.0, "early_stopping_patience": 1, "channels": 8}
    metrics, _ = run(tf_cnn.train, config, small, max_epochs=5)
    assert len(metrics) == 2


def test_fp16_on_cpu_raises_a_clear_error(small: Dataset) -> None:
    with pytest.raises(ValueError, match="precision fp16 needs a GPU; use bf16 or fp32 on CPU"):
        next(tf_cnn.train({"precision": "fp16"}, small, TrialContext(max_epochs=1)))


def test_unknown_key_and_both_clips_are_rejected(small: Dataset) -> None:
    with pytest.raises(ValueError, match="unknown config key"):
        next(tf_cnn.train({"learning_rate": 0.1}, small, TrialContext(max_epochs=1)))
    with pytest.raises(ValueError, match="clip_norm or clip_value"):
        next(tf_cnn.train({"clip_norm": 1, "clip_value": 1}, small, TrialContext(max_epochs=1)))


def test_bf16_runs_and_the_policy_is_reset(small: Dataset) -> None:
    tiny = Dataset(
        small.x_train[:64],
        small.y_train[:64],
        small.x_val[:32],
        small.y_val[:32],
        num_classes=10,
        name="tiny",
    )
    metrics, model = run(tf_cnn.train, {"precision": "bf16", "channels": 8}, tiny, max_epochs=1)
    assert math.isfinite(metrics[0]["val_loss"])
    assert model.dtype_policy.name == "mixed_bfloat16"
    assert model.output.dtype == "float32"
    assert keras.config.dtype_policy().name == "float32"


def test_image_folder_trains_one_epoch(digits: Dataset, tmp_path: Path) -> None:
    from PIL import Image

    for label in range(10):
        folder = tmp_path / "images" / str(label)
        folder.mkdir(parents=True)
        images = digits.x_train[digits.y_train == label][:20, 0]
        for i, image in enumerate(images):
            pixels = (image * 255 / 16).astype(np.uint8)
            Image.fromarray(pixels, "L").resize((16, 16)).save(folder / f"{i}.png")
    empty = np.zeros((0, 1, 8, 8), np.float32)
    labels = np.zeros(0, np.int64)
    none = Dataset(empty, labels, empty, labels, 10, "image_folder", image_size=16)
    metrics, model = run(
        tf_cnn.train, {"channels": 8}, none, max_epochs=1, data_path=str(tmp_path / "images")
    )
    assert len(metrics) == 1 and set(metrics[0]) >= KEYS
    assert tuple(model.input_shape) == (None, 16, 16, 3)
    assert model.output_shape == (None, 10)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("weights") / "mobilenet.weights.h5"
    return tf_transfer.pretrain_backbone(path, epochs=1, seed=1)


def _backbone(model: keras.Model) -> keras.Model:
    return next(layer for layer in model.layers if isinstance(layer, keras.Model))


def test_transfer_loads_weights_freezes_backbone_and_trains_head(
    pretrained: str, small: Dataset
) -> None:
    config = {"lr": 3e-3, "weights_path": pretrained, "freeze_backbone": True}
    cfg = common.read_config(config, tf_transfer.DEFAULTS, tf_transfer.CHOICES)
    initial, _ = tf_transfer.build_model(cfg, tfdata.from_arrays(small), seed=0)
    head_before = initial.layers[-1].get_weights()  # the head as built, before any epoch
    ctx = TrialContext(max_epochs=2, num_threads=2, seed=0)
    model, _ = train_to_end(tf_transfer.train, config, small, ctx).model
    backbone, head = _backbone(model), model.layers[-1]
    from_file = tf_transfer.make_backbone("mobilenet_v3_small", 32)
    from_file.load_weights(pretrained)
    fresh = tf_transfer.make_backbone("mobilenet_v3_small", 32)
    for now, saved in zip(backbone.get_weights(), from_file.get_weights(), strict=True):
        np.testing.assert_array_equal(now, saved)  # frozen, moving statistics included
    pairs = zip(from_file.get_weights(), fresh.get_weights(), strict=True)
    changed = [not np.allclose(a, b) for a, b in pairs]
    assert sum(changed) > len(changed) // 2  # loading replaced a fresh init
    assert not np.allclose(head.get_weights()[0], head_before[0])  # the head trains


def test_unfreeze_blocks_trains_only_the_last_blocks(small: Dataset) -> None:
    cfg = common.read_config({"unfreeze_blocks": 2}, tf_transfer.DEFAULTS, tf_transfer.CHOICES)
    _, backbone = tf_transfer.build_model(cfg, tfdata.from_arrays(small), seed=0)
    trainable = [layer for layer in backbone.layers if layer.trainable_weights]
    blocks = {tf_transfer.block_of(layer.name) for layer in trainable}
    assert blocks == {"expanded_conv_10", "conv_1"}
    assert not any(isinstance(layer, keras.layers.BatchNormalization) for layer in trainable)


def test_pretrain_wants_a_weights_h5_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\.weights\.h5"):
        tf_transfer.pretrain_backbone(tmp_path / "backbone.h5")


def test_checkpoint_restores_weights_optimizer_counters_and_epoch(
    digits: Dataset, tmp_path: Path
) -> None:
    """A retried trial continues after its last checkpoint instead of starting over."""
    import json

    cfg = {"lr": 3e-3, "channels": 8, "lr_scheduler": "plateau", "early_stopping_patience": 5}
    saved = tmp_path / "ckpt"
    saved.mkdir()
    first = list(
        tf_cnn.train(
            cfg, digits, TrialContext(max_epochs=3, num_threads=2, checkpoint_dir=str(saved))
        )
    )
    state = json.loads((saved / loop.STATE_FILE).read_text())
    assert state["epoch"] == 3 and (saved / loop.WEIGHTS_FILE).exists()
    ctx = TrialContext(max_epochs=5, num_threads=2, restore_dir=str(saved), start_epoch=4)
    epochs = tf_cnn.train(cfg, digits, ctx)
    resumed = [next(epochs), next(epochs)]  # epochs 4 and 5 only
    with pytest.raises(StopIteration) as end:
        next(epochs)
    model, _ = end.value.value  # what the generator returned
    steps = math.ceil(len(digits.y_train) / 64)
    assert int(model.optimizer.iterations.numpy()) == 5 * steps  # the step count went on
    assert resumed[0]["val_accuracy"] > first[0]["val_accuracy"] + 0.05  # not a fresh epoch 1
    assert resumed[0]["val_loss"] < first[0]["val_loss"]
    callbacks = loop.stopping_callbacks(common.read_config(cfg, tf_cnn.DEFAULTS))
    assert loop.load_state(model, callbacks, str(saved)) == 3
    for callback, counters in zip(callbacks, state["callbacks"], strict=True):
        assert counters and {k: getattr(callback, k) for k in counters} == counters
        callback.on_train_begin()  # the first fit's reset is spent: patience counts on
        assert {k: getattr(callback, k) for k in counters} == counters


def test_export_hook_saves_a_keras_file_and_a_saved_model(small: Dataset, tmp_path: Path) -> None:
    from search.contract.registry import declarations

    assert declarations("tf_cnn").export is tf_cnn.export  # found beside train, as for torch
    history: list[dict[str, float]] = []
    ctx = TrialContext(max_epochs=1, num_threads=2, history=history)
    final = tf_cnn.export({"channels": 8}, small, ctx, tmp_path)
    assert (tmp_path / "model.keras").exists() and (tmp_path / "saved_model").is_dir()
    assert final["epochs"] == 1.0 and len(history) == 1
    assert final["export_val_accuracy"] == pytest.approx(final["val_accuracy"], abs=1e-6)
    assert final["input_scale"] == float(small.x_train.max())
    # model.onnx checked against Keras; check accepts the bundle on its shipped rows
    from search.contract.inputs import read_inputs
    from search.handover.check import check_bundle

    assert final["onnx_max_abs_diff"] <= 1e-4
    declared = read_inputs(tmp_path)
    assert declared is not None and declared.model == "model.onnx"
    assert declared.inputs[0].layout == "NHWC" and declared.inputs[0].scale == final["input_scale"]
    assert declared.validation_accuracy == pytest.approx(final["export_val_accuracy"], abs=1e-6)
    (tmp_path / "metrics.json").write_text(json.dumps({"final": final}))
    assert (
        check_bundle(tmp_path)[-1] == "OK: model.onnx reproduces the exported validation accuracy"
    )
