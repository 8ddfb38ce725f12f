"""A plain PyTorch MLP on scikit-learn's breast-cancer data: the path most users take.

Nothing here knows Ray or Optuna. ``load`` runs once, in the driver; ``train`` yields one
metrics dict per epoch and returns its model; ``export`` trains once more and saves it.
``@trainable`` declares the knobs ``train`` reads, so a typo in the space fails up front.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from search import TrialContext, train_to_end, trainable, write_inputs

DEFAULTS = {"lr": 1e-3, "hidden": 32, "dropout": 0.0, "weight_decay": 0.0, "batch_size": 64}
"""Every knob ``train`` reads, with its default (the spec's knobs are checked against it)."""


CLASSES = ["malignant", "benign"]
"""The breast-cancer table's targets 0 and 1, as scikit-learn names them."""


def load(val_fraction: float = 0.25, seed: int = 0) -> dict[str, np.ndarray]:
    """The data, split and standardized with the training split's statistics."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    x, y = load_breast_cancer(return_X_y=True)
    x_tr, x_va, y_tr, y_va = train_test_split(
        x, y, test_size=val_fraction, random_state=seed, stratify=y
    )
    mean, std = x_tr.mean(axis=0), x_tr.std(axis=0) + 1e-8
    return {
        "x_train": ((x_tr - mean) / std).astype(np.float32),
        "y_train": y_tr.astype(np.float32),
        "x_val": ((x_va - mean) / std).astype(np.float32),
        "y_val": y_va.astype(np.float32),
        "mean": mean,  # the export declares them: the served model takes raw rows
        "std": std,
    }


def build(cfg: Mapping[str, Any], features: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, cfg["hidden"]),
        nn.ReLU(),
        nn.Dropout(cfg["dropout"]),
        nn.Linear(cfg["hidden"], 1),
    )


@trainable(defaults=DEFAULTS)
def train(
    config: Mapping[str, Any], data: dict[str, np.ndarray], ctx: TrialContext
) -> Generator[dict[str, float], None, nn.Module]:
    cfg = {**DEFAULTS, **config}
    torch.manual_seed(ctx.seed)
    # the arrays are read-only views of Ray's object store: np.array copies them, writable
    x_tr, y_tr = (
        torch.from_numpy(np.array(data["x_train"])),
        torch.from_numpy(np.array(data["y_train"])),
    )
    x_va, y_va = (
        torch.from_numpy(np.array(data["x_val"])),
        torch.from_numpy(np.array(data["y_val"])),
    )
    model = build(cfg, x_tr.shape[1])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    loss_fn = nn.BCEWithLogitsLoss()
    for _ in range(ctx.start_epoch, ctx.max_epochs + 1):
        model.train()
        for idx in torch.randperm(len(x_tr)).split(cfg["batch_size"]):
            opt.zero_grad()
            loss = loss_fn(model(x_tr[idx]).squeeze(1), y_tr[idx])
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            logits = model(x_va).squeeze(1)
            val_loss = loss_fn(logits, y_va)
            accuracy = ((logits > 0).float() == y_va).float().mean()
        yield {"val_loss": val_loss, "val_accuracy": accuracy, "train_loss": loss}
    return model  # what train_to_end hands the export hook


@train.exporter
def export(
    config: Mapping[str, Any], data: dict[str, np.ndarray], ctx: TrialContext, out_dir: Path
) -> dict[str, float]:
    """Trains like ``train`` (to the end), then saves ``model.pt`` and ``model.onnx``."""
    trained = train_to_end(train, config, data, ctx)
    model = trained.model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out_dir / "model.pt")
    example = torch.from_numpy(np.array(data["x_val"][:2]))
    torch.onnx.export(
        model,
        (example,),
        str(out_dir / "model.onnx"),
        input_names=["x"],
        output_names=["logit"],
        dynamic_axes={"x": {0: "batch"}},
        dynamo=False,
    )
    write_inputs(  # one logit: the second class when it is > 0 (scikit-learn's names)
        out_dir,
        {"x": data["x_val"][:2]},
        validation=(data["x_val"], data["y_val"].astype(np.int64)),
        classes=CLASSES,
        mean=data["mean"],
        std=data["std"],
    )
    return trained.metrics
