"""Trainables with known, deterministic behaviour: no framework, no data, milliseconds a trial.

Name them in a spec as ``search.testing:curve`` or ``search.testing:instant``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from search.data import Dataset
from search.trainable import Metrics, TrialContext


def curve(config: Mapping[str, Any], data: Dataset, ctx: TrialContext) -> Iterator[Metrics]:
    """A learning curve that rises towards ``x`` (in [0, 1], higher is better).

    It checkpoints like a real trainable: each epoch it writes ``state.json`` into
    ``ctx.checkpoint_dir`` and, when retried, continues from ``ctx.start_epoch``.

    Config keys:
        x: Quality in [0, 1]; the curve approaches it.
        lr: Above 1.0 the loss turns NaN at epoch 2 (an exploding run).
        raise_at: Epoch at which the trainable raises ``ValueError``, every attempt.
        fail_once_at: Epoch at which the first attempt raises ``RuntimeError``.
        stop_at: Epoch after which it stops on its own (early stopping).
        sleep: Seconds to wait after each epoch.
    """
    quality = float(config.get("x", 0.5))
    if ctx.restore_dir is not None:  # the saved state must be there and agree with the epoch
        saved = json.loads((Path(ctx.restore_dir) / "state.json").read_text())
        assert saved["epoch"] == ctx.start_epoch - 1
    for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
        if config.get("raise_at") == epoch:
            raise ValueError(f"synthetic failure at epoch {epoch}")
        if config.get("fail_once_at") == epoch and ctx.restore_dir is None:
            raise RuntimeError(f"transient failure at epoch {epoch}")
        accuracy = quality * (1.0 - 0.5**epoch)
        loss = 1.0 - accuracy
        if float(config.get("lr", 0.0)) > 1.0 and epoch >= 2:
            loss = float("nan")
        if ctx.checkpoint_dir is not None:
            (Path(ctx.checkpoint_dir) / "state.json").write_text(json.dumps({"epoch": epoch}))
        yield {"val_accuracy": accuracy, "val_loss": loss}
        if config.get("stop_at") == epoch:
            return
        time.sleep(float(config.get("sleep", 0.0)))


def instant(config: Mapping[str, Any], data: Dataset, ctx: TrialContext) -> Iterator[Metrics]:
    """One epoch, no work: measures pure orchestration overhead."""
    yield {"val_accuracy": float(config.get("x", 0.0))}
