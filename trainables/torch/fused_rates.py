"""Images per second of a fused array of 1, 2, 4, ... members: what ``fuse: auto`` fuses by.

The driver (:mod:`search.tuning.fusion_auto`) runs :func:`array_rates` in one fresh Ray task
that holds one GPU, as a fused host would. It builds the space's largest config as an array
of K members (each its own seed and learning rate, as trials differ), trains
:data:`WARM_STEPS` batches (the first compile their kernels, cuDNN picks its algorithms), then
times :data:`RATE_STEPS` more. Which K comes next is the driver's rule (``next_count``, the
one ``gpus_per_trial: auto`` counts by), handed in, so both probes stop alike: when another
member no longer adds throughput. A K that runs out of memory ends the probe there.

Example (on the CPU, two counts):
    >>> from search.contract.dataset import load_digits
    >>> from trainables.torch.cnn import build_model
    >>> rates = array_rates(build_model, load_digits(0.2, 0), {"channels": 4},
    ...                     next_count=lambda done: None if len(done) >= 2 else 2 ** len(done),
    ...                     steps=2)
    >>> sorted(rates), all(r > 0 for r in rates.values())
    ([1, 2], True)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from search import Dataset, TrialContext
from trainables.knobs import CNN_DEFAULTS, read_config
from trainables.torch.fused_loop import FusedArray, fused_tensors

WARM_STEPS = 5
"""Batches trained before the timing starts."""
RATE_STEPS = 20
"""Batches timed per count."""


def array_rates(
    build_model: Callable[[Mapping[str, Any], Any], Any],
    data: Dataset,
    config: Mapping[str, Any],
    next_count: Callable[[dict[int, float]], int | None],
    defaults: Mapping[str, Any] = CNN_DEFAULTS,
    steps: int = RATE_STEPS,
) -> dict[int, float]:
    """Training images per second of ``config`` as a fused array, by member count.

    Args:
        build_model: The trainable's model builder (an ``nn.Sequential``).
        data: The study's dataset.
        config: The config every member trains (the space's largest).
        next_count: The next count to measure given the rates so far, or ``None`` to stop.
        defaults: The trainable's knobs with their defaults.
        steps: Batches timed per count.
    """
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tensors = fused_tensors(data, device)
    cfg = read_config(config, defaults)
    rates: dict[int, float] = {}
    while (k := next_count(dict(rates))) is not None:
        try:
            rates[k] = _rate(build_model, tensors, cfg, k, steps)
        except torch.cuda.OutOfMemoryError:
            print(f"fuse auto: {k} members do not fit in the GPU's memory", file=sys.stderr)
            break
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
    return rates


def _rate(build: Any, tensors: Any, cfg: Mapping[str, Any], k: int, steps: int) -> float:
    members = [
        ({**cfg, "lr": float(cfg["lr"]) * (1 + i / k)}, TrialContext(max_epochs=10, seed=i))
        for i in range(k)
    ]
    array = FusedArray(build, tensors, members)
    array.train_steps(WARM_STEPS)
    _sync(array)
    start = time.perf_counter()
    images = array.train_steps(steps)
    _sync(array)
    return images / max(time.perf_counter() - start, 1e-9)


def _sync(array: FusedArray) -> None:
    if array.device.type == "cuda":
        torch.cuda.synchronize(array.device)
