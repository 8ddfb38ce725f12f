"""A tiny BERT classifier, built from a config, trained by an unchanged Hugging Face Trainer.

No download and no tokenizer: ``load`` generates token sequences whose label says whether a
*signal* token appears in them. ``train`` builds the Trainer and hands it to
``search.hf.train``; ``export`` trains once more and saves it with ``save_pretrained`` plus
``model.onnx``.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

import search.hf
from search import TrialContext, train_to_end, trainable, write_inputs

DEFAULTS = {"lr": 1e-2, "batch_size": 16, "weight_decay": 0.0}
"""Every knob ``train`` reads, with its default (the spec's knobs are checked against it)."""
VOCAB, LENGTH, SIGNAL = 64, 16, (2, 3, 4)
"""Token ids 0..63 (0: padding, 1: [CLS]); a sequence is positive when it holds a SIGNAL id."""


def load(seed: int = 0, train_size: int = 256, val_size: int = 64) -> dict[str, np.ndarray]:
    """Random sequences ``[CLS] t1 ... t15``; half get one SIGNAL token at a random place."""
    rng = np.random.default_rng(seed)
    n = train_size + val_size
    x = rng.integers(max(SIGNAL) + 1, VOCAB, size=(n, LENGTH))
    y = np.arange(n) % 2
    rng.shuffle(y)
    where = rng.integers(1, LENGTH, size=n)
    x[y == 1, where[y == 1]] = rng.choice(SIGNAL, size=int(y.sum()))
    x[:, 0] = 1
    return {
        "x_train": x[:train_size],
        "y_train": y[:train_size],
        "x_val": x[train_size:],
        "y_val": y[train_size:],
    }


def dataset(x: np.ndarray, y: np.ndarray) -> Any:
    """A plain torch Dataset of the dicts a Hugging Face model takes."""
    import torch

    ids, labels = torch.tensor(x, dtype=torch.long), torch.tensor(y, dtype=torch.long)  # copies

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(ids)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": ids[i], "attention_mask": ids[i] > 0, "labels": labels[i]}

    return Tokens()


def build() -> Any:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def accuracy(prediction: Any) -> dict[str, float]:
    logits, labels = prediction
    return {"accuracy": float((np.asarray(logits).argmax(-1) == labels).mean())}


@trainable(defaults=DEFAULTS)
def train(
    config: Mapping[str, Any], data: dict[str, np.ndarray], ctx: TrialContext
) -> Generator[dict[str, float], None, Any]:
    from transformers import Trainer, set_seed

    set_seed(ctx.seed)
    trainer = Trainer(
        model=build(),
        args=search.hf.training_args({**DEFAULTS, **config}, ctx),
        train_dataset=dataset(data["x_train"], data["y_train"]),
        eval_dataset=dataset(data["x_val"], data["y_val"]),
        compute_metrics=accuracy,
    )
    return (yield from search.hf.train(trainer, ctx))  # returns the trained model


@train.exporter
def export(
    config: Mapping[str, Any], data: dict[str, np.ndarray], ctx: TrialContext, out_dir: Path
) -> dict[str, float]:
    """Trains like ``train`` (to the end), then saves it (``save_pretrained``) and
    ``model.onnx`` (input ``input_ids``, output ``logits``)."""
    import torch

    trained = train_to_end(train, config, data, ctx)
    model = trained.model.eval().cpu()
    model.save_pretrained(out_dir)
    example = torch.tensor(data["x_val"][:2], dtype=torch.long)
    torch.onnx.export(
        _Logits(model),
        (example,),
        str(out_dir / "model.onnx"),
        input_names=["input_ids"],
        output_names=["logits"],
        dynamic_axes={"input_ids": {0: "batch"}},
        dynamo=False,
    )
    write_inputs(out_dir, {"input_ids": data["x_val"][:2]})
    return trained.metrics


def _Logits(model: Any) -> Any:  # noqa: N802 (reads like the class it builds)
    """``model`` as a module from ``input_ids`` to ``logits`` alone (what ONNX exports)."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=input_ids > 0).logits

    return Logits()
