"""A LightningModule MLP on scikit-learn's breast-cancer data, trained by ``trainer.fit``.

The module is plain Lightning: nothing here knows Ray or Optuna. ``search.lightning.fit``
runs ``trainer.fit`` once and yields each epoch's ``callback_metrics`` (what the module
logs with ``self.log``); ``export`` trains once more and saves ``model.onnx``.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import lightning
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import search.lightning
from search import TrialContext, train_to_end, trainable, write_inputs

DEFAULTS = {"lr": 1e-3, "hidden": 32, "dropout": 0.0, "batch_size": 64, "precision": "fp32"}
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


class MLP(lightning.LightningModule):
    """A binary classifier: one hidden layer, logits out, BCE loss."""

    def __init__(self, features: int, hidden: int = 32, dropout: float = 0.0, lr: float = 1e-3):
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(
            nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1)
        )
        self.loss = nn.BCEWithLogitsLoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.loss(self(x).squeeze(1), y)
        self.log("train_loss", loss, on_epoch=True, on_step=False)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x).squeeze(1)
        self.log("val_loss", self.loss(logits, y))
        self.log("val_accuracy", ((logits > 0).float() == y).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def loaders(data: Mapping[str, np.ndarray], batch_size: int) -> tuple[DataLoader, DataLoader]:
    """The training loader (shuffled) and the validation loader (one batch)."""
    # the arrays are read-only views of Ray's object store: np.array copies them, writable
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in data.items()}
    train_set = TensorDataset(tensors["x_train"], tensors["y_train"])
    val_set = TensorDataset(tensors["x_val"], tensors["y_val"])
    return (
        DataLoader(train_set, batch_size=batch_size, shuffle=True),
        DataLoader(val_set, batch_size=len(val_set)),
    )


@trainable(defaults=DEFAULTS)
def train(
    config: Mapping[str, Any], data: dict[str, np.ndarray], ctx: TrialContext
) -> Generator[dict[str, float], None, MLP]:
    cfg = {**DEFAULTS, **config}
    lightning.seed_everything(ctx.seed, verbose=False)
    module = MLP(data["x_train"].shape[1], cfg["hidden"], cfg["dropout"], cfg["lr"])
    train_loader, val_loader = loaders(data, cfg["batch_size"])
    return (
        yield from search.lightning.fit(
            module,
            ctx,
            train_dataloaders=train_loader,
            val_dataloaders=val_loader,
            trainer_kwargs={"precision": cfg["precision"]},
        )
    )


@train.exporter
def export(
    config: Mapping[str, Any], data: dict[str, np.ndarray], ctx: TrialContext, out_dir: Path
) -> dict[str, float]:
    """Trains like ``train`` (to the end), then saves ``model.onnx``."""
    trained = train_to_end(train, config, data, ctx)
    model = trained.model.eval().float()
    out_dir.mkdir(parents=True, exist_ok=True)
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
