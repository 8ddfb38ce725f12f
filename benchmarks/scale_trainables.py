"""Trainables of the benchmarks (imported by Ray's workers as ``benchmarks.scale_trainables``).

``ticker`` is :func:`search.testing.curve` with the wall time of each report added, so the
driver can measure how far behind the trainables the study is. ``fixed_work`` does the same
single-thread torch work every epoch whatever its config, so contenders differ only in what
they add around it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from search.contract import TrialContext
from search.testing import curve

SENT_AT = "sent_at"
"""The ``time.time()`` at which the trainable yielded the epoch."""


def ticker(config: Mapping[str, Any], data: Any, ctx: TrialContext) -> Iterator[dict[str, float]]:
    """:func:`search.testing.curve`, each epoch stamped with :data:`SENT_AT`, the trial and the
    process it ran in."""
    for metrics in curve(config, data, ctx):
        yield {
            **metrics,
            SENT_AT: time.time(),
            "number": float(ctx.trial_number),
            "worker_pid": float(os.getpid()),
        }


_WORK: dict[str, Any] = {}


def _work_tensors(size: int) -> tuple[Any, Any]:
    import torch

    key = f"w{size}"
    if key not in _WORK:
        gen = torch.Generator().manual_seed(0)
        _WORK[key] = (
            torch.randn(size, size, generator=gen),
            torch.randn(size, size, generator=gen),
        )
    return _WORK[key]


def calibrate(seconds: float = 0.15, size: int = 256) -> int:
    """How many ``size``-square matmuls take ``seconds`` on one thread here."""
    import torch

    torch.set_num_threads(1)
    a, b = _work_tensors(size)
    for _ in range(5):
        a @ b
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < 1.0:
        a @ b
        n += 1
    return max(1, round(n * seconds / (time.perf_counter() - start)))


def fixed_work(
    config: Mapping[str, Any], data: Any, ctx: TrialContext
) -> Iterator[dict[str, float]]:
    """``config["reps"]`` single-thread matmuls per epoch (the same for every config), then a
    curve toward ``config["x"]``; like the built-in trainables it saves its state (here a few
    bytes) into ``ctx.checkpoint_dir`` every epoch when it has one."""
    import torch

    torch.set_num_threads(1)
    a, b = _work_tensors(int(config.get("size", 256)))
    quality = float(config.get("x", 0.5))
    for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
        for _ in range(int(config["reps"])):
            a @ b
        accuracy = quality * (1.0 - 0.5**epoch)
        if ctx.checkpoint_dir is not None:
            (Path(ctx.checkpoint_dir) / "state.json").write_text(json.dumps({"epoch": epoch}))
        yield {"val_accuracy": accuracy, "val_loss": 1.0 - accuracy}
