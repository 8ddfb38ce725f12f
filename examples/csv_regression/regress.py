"""A regression from a CSV file: a declared loader, a scikit-learn model, ``val_rmse``/min.

The driver calls ``load`` once (``data: {loader: ..., args: {path: ...}}`` in the spec) and
every trial receives its result; ``train`` fits ``SGDRegressor`` one pass per epoch.
"""

from __future__ import annotations

import pickle
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from search import TrialContext, train_to_end, trainable, write_inputs

DEFAULTS = {"alpha": 1e-4, "eta0": 1e-2, "penalty": "l2"}


def load(path: str, target: str, val_fraction: float = 0.2, seed: int = 0) -> dict[str, Any]:
    """The CSV's columns as features, ``target`` as the value to predict; standardized."""
    import pandas as pd
    from sklearn.model_selection import train_test_split

    frame = pd.read_csv(path)
    x = frame.drop(columns=[target]).to_numpy(np.float64)
    y = frame[target].to_numpy(np.float64)
    x_tr, x_va, y_tr, y_va = train_test_split(x, y, test_size=val_fraction, random_state=seed)
    mean, std = x_tr.mean(axis=0), x_tr.std(axis=0) + 1e-12
    return {
        "x_train": (x_tr - mean) / std,
        "y_train": y_tr,
        "x_val": (x_va - mean) / std,
        "y_val": y_va,
        "features": list(frame.columns.drop(target)),
    }


@trainable(defaults=DEFAULTS)
def train(
    config: Mapping[str, Any], data: dict[str, Any], ctx: TrialContext
) -> Generator[dict[str, float], None, Any]:
    from sklearn.linear_model import SGDRegressor

    cfg = {**DEFAULTS, **config}
    model = SGDRegressor(
        alpha=cfg["alpha"], eta0=cfg["eta0"], penalty=cfg["penalty"], random_state=ctx.seed
    )
    scale = float(np.std(data["y_train"]))  # fit the target in units of its spread
    for _ in range(ctx.start_epoch, ctx.max_epochs + 1):
        model.partial_fit(data["x_train"], data["y_train"] / scale)
        rmse = np.sqrt(np.mean((model.predict(data["x_val"]) * scale - data["y_val"]) ** 2))
        train_rmse = np.sqrt(
            np.mean((model.predict(data["x_train"]) * scale - data["y_train"]) ** 2)
        )
        yield {"val_rmse": rmse, "train_rmse": train_rmse}
    return model  # what train_to_end hands the export hook


@train.exporter
def export(
    config: Mapping[str, Any], data: dict[str, Any], ctx: TrialContext, out_dir: Path
) -> dict[str, float]:
    """Trains like ``train``, pickles the model; no ONNX (the card says what is not checked)."""
    trained = train_to_end(train, config, data, ctx)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "model.pkl").write_bytes(pickle.dumps(trained.model))
    write_inputs(out_dir, {"x": data["x_val"][:2].astype(np.float64)})
    return trained.metrics
