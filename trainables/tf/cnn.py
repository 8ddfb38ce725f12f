"""A small Keras CNN for image classification, the TensorFlow twin of ``torch_cnn``.

Config keys (all optional, same names as the PyTorch twin): ``lr``, ``batch_size``,
``optimizer`` (sgd|adam|adamw), ``momentum``, ``weight_decay``, ``l1``, ``dropout``,
``channels`` (first conv width, default 32), ``train_fraction`` (stratified share of the
training arrays to train on, default 1.0; the overfitting demo), ``lr_scheduler``
(none|step|cosine|plateau|cyclic|onecycle), ``step_size``, ``gamma``, ``augment``, ``hflip``,
``early_stopping_patience``, ``early_stopping_min_delta``, ``clip_norm``, ``clip_value`` (one
of the two), ``precision`` (fp32|bf16|fp16, fp16 on a GPU only), ``num_workers`` and
``pin_memory`` (accepted and ignored: tf.data sizes its work with AUTOTUNE).

Its first epoch is the slowest: it traces the graph (benchmarks/RESULTS.md gives the times).

Data: the framework's arrays, or an image folder (:func:`trainables.tf.data.load_data`;
``data`` may then hold empty arrays).

Getting the trained model: the generator returns ``(model, splits)`` after its last epoch,
which :func:`search.train_to_end` hands over::

    model, splits = train_to_end(train, config, data, TrialContext(max_epochs=5)).model
    model.save("cnn.keras")
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

import keras

from search import Dataset, Metrics, TrialContext, trainable
from trainables.knobs import CNN_DEFAULTS
from trainables.tf import common
from trainables.tf import data as tfdata
from trainables.tf.export import make_exporter
from trainables.tf.loop import Fitted, fit_epochs

DEFAULTS: dict[str, Any] = CNN_DEFAULTS  # framework-free: the driver reads them there
"""Every key :func:`train` reads, with its default."""


def build_model(cfg: Mapping[str, Any], splits: tfdata.Splits, seed: int) -> keras.Model:
    """The twin of ``torch_cnn``: two conv stages (c, then 2c channels), a dense head.

    Augmentation (training only) and the standardization adapted on the training split are
    the model's first layers; the softmax stays float32 under mixed precision. No batch
    norm: with lr 0 the model is exactly unchanged by training.
    """
    c, p, reg = int(cfg["channels"]), cfg["dropout"], common.regularizer(cfg)

    def conv(filters: int) -> keras.layers.Layer:
        return keras.layers.Conv2D(
            filters, 3, padding="same", activation="relu", kernel_regularizer=reg
        )

    inputs, x = common.model_inputs(cfg, splits, seed)
    x = keras.layers.MaxPooling2D()(conv(c)(conv(c)(x)))
    x = keras.layers.MaxPooling2D()(conv(2 * c)(x))
    x = keras.layers.Dropout(p)(keras.layers.Flatten()(x))
    x = keras.layers.Dense(128, activation="relu", kernel_regularizer=reg)(x)
    x = keras.layers.Dropout(p)(x)
    outputs = keras.layers.Dense(
        splits.num_classes, activation="softmax", dtype="float32", kernel_regularizer=reg
    )(x)
    return keras.Model(inputs, outputs, name="tf_cnn")


# data_parallel: one process, the model mirrored over its devices (trainables.tf.devices).
@trainable(defaults=DEFAULTS, data_parallel="in_process")
def train(
    config: Mapping[str, Any], data: Dataset, ctx: TrialContext
) -> Generator[Metrics, None, Fitted]:
    """The ``tf_cnn`` trainable: one metrics dict per epoch (:mod:`trainables.tf.loop`).

    Raises:
        ValueError: On an unknown config key, a bad choice, both clip options, fp16 on CPU,
            or a ``train_fraction`` outside (0, 1].
    """
    cfg, strategy = common.setup(config, DEFAULTS, ctx)
    splits = tfdata.load_data(data, ctx, cfg["train_fraction"])
    with common.model_scope(cfg["precision"], strategy):
        model = build_model(cfg, splits, ctx.seed)
        common.compile_model(model, cfg, ctx.max_epochs, splits.n_train)
    return (yield from fit_epochs(model, splits, cfg, ctx, strategy))


export = train.exporter(make_exporter(train))
"""The export hook: ``model.keras`` and a SavedModel (:mod:`trainables.tf.export`)."""
