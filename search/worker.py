"""What runs inside a Ray trial: drive a trainable's generator, one Tune report per epoch.

This is the only code that runs in the trial's process. It resolves the trainable (imported
once per reused actor, not once per trial), sets the trial's thread count and seed, turns the
state the trainable saves each epoch into a Tune checkpoint (so a retried trial resumes where
it failed), and stops the trial itself at the first NaN or infinite metric, so ASHA never has
to run a diverged trial to the end.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.distributed import data_parallel
from search.placement import share_extras
from search.record import (
    DEVICE,
    EPOCH,
    FAIL_REASON,
    NODE,
    NUMBER,
    REPLICAS,
    SEED,
    nonfinite_reason,
)
from search.trainable import RESERVED_PREFIX, TrialContext, resolve_trainable

if TYPE_CHECKING:
    from search.data import Dataset

EPOCH_FILE = "search_epoch.json"
"""Written by the worker into every checkpoint: the epoch it holds."""


@dataclass(frozen=True)
class TrialJob:
    """What every trial of a study shares (sent once through Ray's object store)."""

    trainable: str
    max_epochs: int
    num_threads: int = 1
    checkpoints: bool = True
    workers: int = 1
    """Processes that train each trial data-parallel (:mod:`search.distributed`)."""
    extras: Mapping[str, Any] = field(default_factory=dict)


def _placement() -> tuple[str, str]:
    """The trial's device (``cpu`` or ``cuda`` with Ray's GPU ids) and Ray node."""
    import ray

    gpu_ids = ray.get_gpu_ids()
    device = f"cuda ({','.join(str(i) for i in gpu_ids)})" if gpu_ids else "cpu"
    node = ray.get_runtime_context().get_node_id()[:12]
    return device, f"{socket.gethostname()}/{node}"


def _restored() -> tuple[str | None, int]:
    """The folder of the checkpoint Tune restored (if any) and the epoch it holds."""
    from ray import tune

    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return None, 0
    folder = tempfile.mkdtemp(prefix="search-restore-")
    checkpoint.to_directory(folder)
    epoch = json.loads((Path(folder) / EPOCH_FILE).read_text())["epoch"]
    return folder, int(epoch)


def _gpu_share() -> float | None:
    """The share of a GPU Ray holds for this trial now (a retry may hold more than planned)."""
    from ray import tune

    resources = tune.get_context().get_trial_resources()
    share = getattr(resources, "required_resources", {}).get("GPU")
    return float(share) if share else None


def _context(config: Mapping[str, Any], job: TrialJob, device: str) -> TrialContext:
    from ray import tune

    restore_dir, done = _restored()
    extras = share_extras(job.extras, _gpu_share()) if device != "cpu" else job.extras
    return TrialContext(
        max_epochs=job.max_epochs,
        seed=int(config.get(SEED, 0)),
        num_threads=job.num_threads,
        device="cuda" if device.startswith("cuda") else "cpu",
        trial_number=int(config.get(NUMBER, 0)),
        trial_dir=tune.get_context().get_trial_dir() or ".",
        extras=extras,
        checkpoint_dir=tempfile.mkdtemp(prefix="search-ckpt-") if job.checkpoints else None,
        restore_dir=restore_dir,
        start_epoch=done + 1,
    )


def _checkpoint(ctx: TrialContext, epoch: int) -> Any:
    """The epoch's Tune checkpoint, when the trainable saved state into ``checkpoint_dir``."""
    from ray import tune

    folder = ctx.checkpoint_dir
    if folder is None or not any(p.name != EPOCH_FILE for p in Path(folder).iterdir()):
        return None
    (Path(folder) / EPOCH_FILE).write_text(json.dumps({"epoch": epoch}))
    return tune.Checkpoint.from_directory(folder)


def run_trial(config: dict[str, Any], job: TrialJob, data: Dataset) -> None:
    """The Ray Tune function trainable: one ``tune.report`` per epoch the trainable yields."""
    from ray import tune

    os.environ.setdefault("OMP_NUM_THREADS", str(job.num_threads))
    train = resolve_trainable(job.trainable)
    device, node = _placement()
    ctx = _context(config, job, device)
    params = {k: v for k, v in config.items() if not k.startswith(RESERVED_PREFIX)}
    if job.workers > 1:
        epochs = data_parallel(job.trainable, params, data, ctx, job.workers)
    else:
        epochs = train(params, data, ctx)
    planned = job.workers * int(job.extras.get("replicas") or 1)
    try:
        for epoch, metrics in enumerate(epochs, start=ctx.start_epoch):
            reason = nonfinite_reason(metrics, epoch)
            replicas = int(metrics.get("replicas", planned))  # what the trainable really used
            report = {**metrics, EPOCH: epoch, DEVICE: device, NODE: node, REPLICAS: replicas}
            if reason:
                report[FAIL_REASON] = reason
            tune.report(report, checkpoint=None if reason else _checkpoint(ctx, epoch))
            if reason or epoch >= job.max_epochs:
                return
    finally:
        if hasattr(epochs, "close"):
            epochs.close()
        for folder in (ctx.checkpoint_dir, ctx.restore_dir):
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
