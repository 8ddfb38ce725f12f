"""An unchanged Keras ``model.fit`` on scikit-learn's wine data, through ``search.keras.fit``.

``fit`` runs once over all epochs, so the ``EarlyStopping`` callback keeps its state; each
epoch's logs go to the study; ASHA's prune stops training cleanly.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

import search.keras
from search import TrialContext, trainable

DEFAULTS = {"lr": 1e-2, "units": 16, "batch_size": 16, "patience": 3}


def load(seed: int = 0) -> dict[str, np.ndarray]:
    """Wine, split 75/25 and standardized on the training split."""
    from sklearn.datasets import load_wine
    from sklearn.model_selection import train_test_split

    x, y = load_wine(return_X_y=True)
    x_tr, x_va, y_tr, y_va = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    mean, std = x_tr.mean(axis=0), x_tr.std(axis=0) + 1e-8
    return {
        "x_train": ((x_tr - mean) / std).astype("float32"),
        "y_train": y_tr,
        "x_val": ((x_va - mean) / std).astype("float32"),
        "y_val": y_va,
    }


def build(cfg: Mapping[str, Any], features: int) -> Any:
    import keras

    model = keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(cfg["units"], "relu"),
            keras.layers.Dense(3, "softmax"),
        ]
    )
    model.compile(
        keras.optimizers.Adam(cfg["lr"]), "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


@trainable(defaults=DEFAULTS)
def train(
    config: Mapping[str, Any], data: dict[str, np.ndarray], ctx: TrialContext
) -> Generator[dict[str, float], None, Any]:
    import keras

    cfg = {**DEFAULTS, **config}
    keras.utils.set_random_seed(ctx.seed)
    model = build(cfg, data["x_train"].shape[1])
    stop = keras.callbacks.EarlyStopping("val_loss", patience=cfg["patience"])
    return (
        yield from search.keras.fit(  # returns the trained model
            model,
            ctx,
            data["x_train"],
            data["y_train"],
            validation_data=(data["x_val"], data["y_val"]),
            batch_size=cfg["batch_size"],
            callbacks=[stop],
        )
    )


@train.exporter
def export(
    config: Mapping[str, Any], data: dict[str, np.ndarray], ctx: TrialContext, out_dir: Path
) -> dict[str, float]:
    """Trains like ``train``, saves ``model.keras`` and ``model.onnx``; ``train_and_save``
    declares the ONNX graph's input (its own name), output and validation rows in
    ``inputs.json``."""
    return search.keras.train_and_save(train, config, data, ctx, out_dir)
