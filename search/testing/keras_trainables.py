"""Two small TensorFlow trainables that import their framework inside the function, as a
user's project does: a Keras ``model.fit`` (through :func:`search.keras.fit`) or a
``tf.GradientTape`` loop, by the knob ``kind``, so one reused process can run both.

Name it in a spec as ``search.testing.keras_trainables:either``, with the data of
``search.testing.keras_trainables:blobs``. Each epoch yields ``val_accuracy``, ``val_loss``
and ``first_weight`` (the model's first initial weight: the same for the same seed).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

import search.keras
from search.contract import Metrics, TrialContext, train_to_end, trainable

Arrays = dict[str, np.ndarray]


def blobs(n: int = 96, features: int = 4) -> Arrays:
    """Two Gaussian blobs, ``n`` rows, three quarters for training (a loader)."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, n)
    x = (rng.normal(size=(n, features)) + y[:, None] * 1.5).astype(np.float32)
    cut = 3 * n // 4
    return {"x_train": x[:cut], "y_train": y[:cut], "x_val": x[cut:], "y_val": y[cut:]}


@trainable(defaults={"lr": 0.05, "kind": "fit"})
def either(
    config: Mapping[str, Any], data: Any, ctx: TrialContext
) -> Generator[Metrics, None, Any]:
    """Keras ``fit`` (``kind: fit``) or a ``GradientTape`` loop (``kind: tape``)."""
    if config["kind"] == "fit":
        return (yield from _fit(float(config["lr"]), data, ctx))
    return (yield from _tape(float(config["lr"]), data, ctx))


@either.exporter
def export(config: Mapping[str, Any], data: Any, ctx: TrialContext, out_dir: Path) -> Metrics:
    """Trains to the end and saves nothing but ``metrics.txt``."""
    trained = train_to_end(either, config, data, ctx)
    (Path(out_dir) / "metrics.txt").write_text(repr(trained.metrics))
    return {**trained.metrics, "epochs": float(trained.epochs)}


def _fit(lr: float, data: Arrays, ctx: TrialContext) -> Generator[Metrics, None, Any]:
    import keras

    model = keras.Sequential([keras.Input((data["x_train"].shape[1],)), keras.layers.Dense(2)])
    model.compile(
        keras.optimizers.SGD(lr),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    first = float(model.layers[0].kernel.numpy().flat[0])
    epochs = search.keras.fit(
        model,
        ctx,
        data["x_train"],
        data["y_train"],
        validation_data=(data["x_val"], data["y_val"]),
        batch_size=32,
    )
    for logs in epochs:
        yield {"val_accuracy": logs["val_accuracy"], "val_loss": logs["val_loss"]} | {
            "first_weight": first
        }
    return model


def _tape(lr: float, data: Arrays, ctx: TrialContext) -> Generator[Metrics, None, Any]:
    import tensorflow as tf

    features = data["x_train"].shape[1]
    w = tf.Variable(tf.random.normal((features, 2), stddev=0.1))
    b = tf.Variable(tf.zeros(2))
    first = float(w.numpy().flat[0])
    x, y = tf.constant(data["x_train"]), tf.constant(data["y_train"])
    xv, yv = tf.constant(data["x_val"]), data["y_val"]
    for _ in range(ctx.start_epoch, ctx.max_epochs + 1):
        with tf.GradientTape() as tape:
            logits = tf.matmul(x, w) + b
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
            )
        for var, grad in zip((w, b), tape.gradient(loss, [w, b]), strict=True):
            var.assign_sub(lr * grad)
        val = tf.matmul(xv, w) + b
        val_loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=yv, logits=val)
        )
        accuracy = float(np.mean(np.argmax(val.numpy(), 1) == yv))
        yield {"val_accuracy": accuracy, "val_loss": float(val_loss), "first_weight": first}
    return (w, b)
