"""Transfer learning with a ``keras.applications`` backbone, weights from a local file.

Config keys: those of :mod:`trainables.tf.cnn` except ``channels``, plus

* ``backbone``: ``mobilenet_v3_small`` (default, fast on CPU) or ``mobilenet_v3_large``;
* ``weights_path``: a ``.weights.h5`` file saved by ``backbone.save_weights`` (for example by
  :func:`pretrain_backbone`); empty means a random init. Nothing is ever downloaded;
* ``freeze_backbone`` (default True): train only the head;
* ``unfreeze_blocks`` (default 0): with a frozen backbone, train its last N blocks anyway
  (their batch norms stay frozen, as Keras recommends for fine-tuning);
* ``image_size`` (default 32, the applications' minimum): inputs (the digits, or an image
  folder read at the data's ``image_size``: :func:`trainables.tf.data.load_data`) are
  standardized, resized to it inside the model, and one channel is repeated to three.

``weight_decay`` (sgd/adam) and ``l1`` regularize the head only. The trained model is exposed
as in :mod:`trainables.tf.cnn`: the generator returns ``(model, splits)``.

Pretrain a backbone on digits 0-4 (a different task than the 10-digit search)::

    python -m trainables.tf.transfer --pretrain results/mobilenet.weights.h5
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import keras
import numpy as np

from search import Dataset, Metrics, TrialContext, load_digits, trainable
from trainables.knobs import TF_TRANSFER_DEFAULTS
from trainables.tf import common
from trainables.tf import data as tfdata
from trainables.tf.export import make_exporter
from trainables.tf.loop import Fitted, fit_epochs

BACKBONES = {
    "mobilenet_v3_small": keras.applications.MobileNetV3Small,
    "mobilenet_v3_large": keras.applications.MobileNetV3Large,
}
"""Backbone constructors by config name (built with ``weights=None``)."""

DEFAULTS: dict[str, Any] = TF_TRANSFER_DEFAULTS  # framework-free: the driver reads them there
"""Every key :func:`train` reads, with its default."""

CHOICES = {"backbone": tuple(BACKBONES)}

BN_MOMENTUM = 0.9
"""Batch-norm momentum of the backbones (see :func:`make_backbone`)."""


def make_backbone(name: str, image_size: int) -> keras.Model:
    """The backbone without its classifier, random init, for ``image_size`` RGB inputs.

    Its batch norms get momentum 0.9 instead of MobileNetV3's 0.999, so that their moving
    statistics (what a frozen backbone uses) settle within the few hundred steps of a
    small-data run.
    """
    net = BACKBONES[name](
        input_shape=(image_size, image_size, 3),
        include_top=False,
        weights=None,
        include_preprocessing=False,
    )
    for layer in net.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = BN_MOMENTUM
    return net


def block_of(layer_name: str) -> str:
    """The block a backbone layer belongs to (``expanded_conv_3``, ``conv_1``, ...)."""
    match = re.match(r"(expanded_conv(?:_\d+)?|conv(?:_\d+)?)(?:_|$)", layer_name)
    return match.group(1) if match else layer_name


def set_trainable(backbone: keras.Model, freeze: bool, unfreeze_blocks: int) -> None:
    """Freezes the backbone, except its last ``unfreeze_blocks`` blocks (batch norms stay frozen).

    A frozen ``BatchNormalization`` also runs in inference mode in Keras 3, so a frozen
    backbone keeps every weight, moving statistics included.
    """
    if not freeze:
        backbone.trainable = True
        return
    if unfreeze_blocks <= 0:
        backbone.trainable = False
        return
    blocks = list(dict.fromkeys(block_of(layer.name) for layer in backbone.layers if layer.weights))
    open_blocks = set(blocks[-unfreeze_blocks:])
    backbone.trainable = True
    for layer in backbone.layers:
        is_bn = isinstance(layer, keras.layers.BatchNormalization)
        layer.trainable = block_of(layer.name) in open_blocks and not is_bn


def build_model(
    cfg: Mapping[str, Any], splits: tfdata.Splits, seed: int
) -> tuple[keras.Model, keras.Model]:
    """Augment, standardize, resize, repeat to RGB, backbone, pooling, dropout, softmax.

    Returns:
        ``(model, backbone)``, the backbone loaded from ``weights_path`` and frozen as asked.
    """
    size = int(cfg["image_size"])
    inputs, x = common.model_inputs(cfg, splits, seed)
    if splits.input_shape[:2] != (size, size):
        x = keras.layers.Resizing(size, size)(x)
    if splits.input_shape[2] == 1:
        x = keras.layers.Concatenate()([x, x, x])
    backbone = make_backbone(cfg["backbone"], size)
    if cfg["weights_path"]:
        backbone.load_weights(cfg["weights_path"])
    set_trainable(backbone, cfg["freeze_backbone"], cfg["unfreeze_blocks"])
    x = keras.layers.GlobalAveragePooling2D()(backbone(x))
    x = keras.layers.Dropout(cfg["dropout"])(x)
    outputs = keras.layers.Dense(
        splits.num_classes,
        activation="softmax",
        dtype="float32",
        kernel_regularizer=common.regularizer(cfg),
    )(x)
    return keras.Model(inputs, outputs, name="tf_transfer"), backbone


# data_parallel: one process, the model mirrored over its devices (trainables.tf.devices).
@trainable(defaults=DEFAULTS, data_parallel="in_process")
def train(
    config: Mapping[str, Any], data: Dataset, ctx: TrialContext
) -> Generator[Metrics, None, Fitted]:
    """The ``tf_transfer`` trainable: one metrics dict per epoch (:mod:`trainables.tf.loop`).

    Raises:
        ValueError: On an unknown config key, a bad choice, both clip options, or fp16 on CPU.
    """
    cfg, strategy = common.setup(config, DEFAULTS, ctx, CHOICES)
    splits = tfdata.load_data(data, ctx)
    with common.model_scope(cfg["precision"], strategy):
        model, _ = build_model(cfg, splits, ctx.seed)
        common.compile_model(model, cfg, ctx.max_epochs, splits.n_train)
    return (yield from fit_epochs(model, splits, cfg, ctx, strategy))


export = train.exporter(make_exporter(train))
"""The export hook: ``model.keras`` and a SavedModel (:mod:`trainables.tf.export`)."""


def recalibrate_batch_norm(model: keras.Model, backbone: keras.Model, images: np.ndarray) -> None:
    """Sets the backbone's batch-norm moving statistics to the trained network's on ``images``.

    After a short training the moving averages still lag behind the weights, and a frozen
    backbone (batch norms in inference mode) would then compute near-constant features. One
    training-mode pass with momentum 0 (no weight update; ``model`` must have no active
    augmentation or dropout) replaces them with the statistics of the final network.
    """
    norms = [lay for lay in backbone.layers if isinstance(lay, keras.layers.BatchNormalization)]
    for layer in norms:
        layer.momentum = 0.0
    model(images, training=True)
    for layer in norms:
        layer.momentum = BN_MOMENTUM


def pretrain_backbone(
    path: str | Path,
    backbone: str = "mobilenet_v3_small",
    epochs: int = 1,
    image_size: int = 32,
    seed: int = 0,
    num_threads: int = 2,
) -> str:
    """Trains a backbone on digits 0-4 only (another task) and saves its weights.

    Backbone and a 5-class head train together (no augmentation, no dropout); then the batch
    norms are recalibrated (:func:`recalibrate_batch_norm`) and the backbone's weights saved.

    Args:
        path: Where to write the weights; must end with ``.weights.h5``.
        backbone: A name in :data:`BACKBONES`.
        epochs: Training epochs (backbone and head both train).
        image_size: Input size the backbone is built for.
        seed: Seed of the data split and of training.
        num_threads: TF threads, when this is the process's first use of TF.

    Returns:
        ``path`` as a string.
    """
    if not str(path).endswith(".weights.h5"):
        raise ValueError(f"weights file must end with .weights.h5, got {str(path)!r}")
    digits = load_digits(0.2, seed)
    keep_tr, keep_va = digits.y_train < 5, digits.y_val < 5
    data = Dataset(
        digits.x_train[keep_tr],
        digits.y_train[keep_tr],
        digits.x_val[keep_va],
        digits.y_val[keep_va],
        num_classes=5,
        name="digits0-4",
    )
    config = {"lr": 3e-3, "backbone": backbone, "freeze_backbone": False, "image_size": image_size}
    ctx = TrialContext(max_epochs=epochs, seed=seed, num_threads=num_threads)
    cfg, _ = common.setup(config, DEFAULTS, ctx, CHOICES)
    splits = tfdata.from_arrays(data)
    model, net = build_model(cfg, splits, seed)
    common.compile_model(model, cfg, epochs, splits.n_train)
    train_ds = tfdata.pipeline(splits.train, cfg["batch_size"], num_threads, seed)
    model.fit(train_ds, epochs=epochs, shuffle=False, verbose=0)
    recalibrate_batch_norm(model, net, np.concatenate([x for x, _ in train_ds]))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    net.save_weights(str(path))
    return str(path)


def main(argv: list[str] | None = None) -> None:
    """``python -m trainables.tf.transfer --pretrain PATH [--backbone B] [--epochs N]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain", required=True, metavar="PATH", help="*.weights.h5 to write")
    parser.add_argument("--backbone", default="mobilenet_v3_small", choices=sorted(BACKBONES))
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = pretrain_backbone(args.pretrain, args.backbone, args.epochs, args.image_size, args.seed)
    print(f"saved {args.backbone} weights to {path}")


if __name__ == "__main__":
    main()
