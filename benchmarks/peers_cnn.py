"""The digits CNN as a user trainable (``benchmarks.peers_cnn:train``), for every contender.

It is the built-in ``torch_cnn`` generator, declared as a user would declare their own, that
also appends one line per epoch, ``<unix time> <val_accuracy>``, to the file named by
``$PEERS_EPOCH_LOG``. Every contender of :mod:`benchmarks.peers` trains this same function,
and the benchmark reads its time to target, its best and the epochs it trained from that file:
one clock, one count, whoever orchestrates.
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

from search import TrialContext, trainable
from trainables.knobs import CNN_DEFAULTS

LOG_ENV = "PEERS_EPOCH_LOG"
"""The file each epoch is appended to (unset: nothing is written)."""


@trainable(defaults=CNN_DEFAULTS)
def train(
    config: Mapping[str, Any], data: Any, ctx: TrialContext
) -> Generator[dict[str, float], None, Any]:
    """``trainables.torch.cnn.train``, logging each epoch's time and val_accuracy."""
    from trainables.torch.cnn import train as cnn  # torch first: see the guide's import trap

    log = os.environ.get(LOG_ENV)
    epochs = cnn(config, data, ctx)
    try:
        while True:
            metrics = next(epochs)
            if log:
                with open(log, "a") as fh:  # one short write per line: appends do not interleave
                    fh.write(f"{time.time():.4f} {float(metrics['val_accuracy']):.6f}\n")
            yield metrics
    except StopIteration as stop:
        return stop.value
    finally:
        epochs.close()


def read_log(path: str, start: float) -> list[tuple[float, float]]:
    """The ``(seconds since start, val_accuracy)`` of every epoch logged to ``path``."""
    try:
        lines = Path(path).read_text().split("\n")
    except FileNotFoundError:
        return []
    points = []
    for line in lines:
        parts = line.split()
        if len(parts) == 2:
            points.append((float(parts[0]) - start, float(parts[1])))
    return sorted(points)
