"""What runs inside a Ray trial: drive a trainable's generator, one Tune report per epoch.

This is the only code that runs in the trial's process. It resolves the trainable (imported
once per reused actor, not once per trial), sets the trial's thread count and seed, and stops
the trial itself at the first NaN or infinite metric, so ASHA never has to run a diverged
trial to the end.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from search.record import DEVICE, EPOCH, FAIL_REASON, NODE, NUMBER, SEED, nonfinite_reason
from search.trainable import RESERVED_PREFIX, TrialContext, resolve_trainable

if TYPE_CHECKING:
    from search.data import Dataset


@dataclass(frozen=True)
class TrialJob:
    """What every trial of a study shares (sent once through Ray's object store)."""

    trainable: str
    max_epochs: int
    num_threads: int = 1
    extras: Mapping[str, Any] = field(default_factory=dict)


def _placement() -> tuple[str, str]:
    """The trial's device (``cpu`` or ``cuda`` with Ray's GPU ids) and node."""
    import ray

    gpu_ids = ray.get_gpu_ids()
    device = f"cuda ({','.join(str(i) for i in gpu_ids)})" if gpu_ids else "cpu"
    return device, socket.gethostname()


def run_trial(config: dict[str, Any], job: TrialJob, data: Dataset) -> None:
    """The Ray Tune function trainable: one ``tune.report`` per epoch the trainable yields."""
    from ray import tune

    os.environ.setdefault("OMP_NUM_THREADS", str(job.num_threads))
    train = resolve_trainable(job.trainable)
    device, node = _placement()
    ctx = TrialContext(
        max_epochs=job.max_epochs,
        seed=int(config.get(SEED, 0)),
        num_threads=job.num_threads,
        device="cuda" if device.startswith("cuda") else "cpu",
        trial_number=int(config.get(NUMBER, 0)),
        trial_dir=tune.get_context().get_trial_dir() or ".",
        extras=job.extras,
    )
    params = {k: v for k, v in config.items() if not k.startswith(RESERVED_PREFIX)}
    epochs = train(params, data, ctx)
    try:
        for epoch, metrics in enumerate(epochs, start=1):
            reason = nonfinite_reason(metrics, epoch)
            report = {**metrics, EPOCH: epoch, DEVICE: device, NODE: node}
            if reason:
                report[FAIL_REASON] = reason
            tune.report(report)
            if reason or epoch >= job.max_epochs:
                return
    finally:
        epochs.close() if hasattr(epochs, "close") else None
