"""Images per second of k trials at once on one GPU: what ``gpus_per_trial: auto`` packs by.

For each count the decision asks for (:func:`search.compute.throughput.next_count`), k Ray
tasks of the space's largest config start in one placement-group bundle that holds one GPU
(so they share that GPU, as k packed trials would, each capped at its share of the memory),
wait for each other at a barrier once their framework is imported, then train
:data:`RATE_EPOCHS` short epochs of :data:`RATE_STEPS` batches. Each reports the median of its
epochs after the first (the first compiles, tunes cuDNN, allocates): the trainable's own
``train_images_per_s`` where it yields one (every PyTorch built-in does), else batches times
``batch_size`` over the epoch's wall time. The rates of the k tasks are summed.

Every task gets a fresh process (``max_calls=1``), so no CUDA context outlives its count. A
task that fails (out of memory at its share) counts as no throughput for its count. Without a
GPU the tasks train on the CPU: the tests run this code on logical GPUs.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Mapping
from contextlib import closing
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from search.compute.job import TrialJob, trial_context, trial_job
from search.compute.limits import prepare
from search.compute.placement import Share, memory_fraction
from search.compute.throughput import TOLERANCE, next_count
from search.contract import drive
from search.errors import one_line

if TYPE_CHECKING:
    from search.specs.schema import StudySpec

_log = logging.getLogger(__name__)

RATE_STEPS = 20
"""Training batches per measured epoch."""
RATE_EPOCHS = 3
"""Epochs each task trains; the first is left out."""
RATE_TIMEOUT_S = 600.0
"""The most one count's measurement may take."""


def _barrier_class() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class Barrier:
        """Releases every caller of :meth:`arrive` once ``n`` have arrived."""

        def __init__(self, n: int) -> None:
            import asyncio

            self.n, self.count, self.event = n, 0, asyncio.Event()

        async def arrive(self) -> int:
            self.count += 1
            if self.count >= self.n:
                self.event.set()
            await self.event.wait()
            return self.count

    return Barrier


def task_rate(
    job: TrialJob, config: Mapping[str, Any], data: Any, share: Share, barrier: Any
) -> dict[str, Any]:
    """One task of a count: imports the trainable, waits at ``barrier``, trains, and returns
    its images per second (``rate``, 0 when it could not tell), where it ran (``gpu_ids``,
    Ray's) and when (``start``, ``end``: wall clock)."""
    import ray

    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    ctx = trial_context(
        job,
        seed=0,
        device="cuda" if cuda else "cpu",
        share=share,
        max_epochs=RATE_EPOCHS,
        max_steps=RATE_STEPS,
    )
    declared, _ = prepare(job.trainable, ctx)
    ray.get(barrier.arrive.remote(), timeout=RATE_TIMEOUT_S)
    start, rates = time.time(), []
    with closing(drive(declared.train(config, data, ctx), max_epochs=RATE_EPOCHS)) as run:
        last = time.perf_counter()
        for epoch in run:
            now = time.perf_counter()
            images = RATE_STEPS * float(config.get("batch_size") or 0)
            rates.append(float(epoch.metrics.get("train_images_per_s", images / (now - last))))
            last = now
    rate = statistics.median(rates[1:] or rates) if rates else 0.0
    return {"rate": rate, "gpu_ids": ray.get_gpu_ids(), "start": start, "end": time.time()}


def measure_count(
    job: TrialJob, config: Mapping[str, Any], data: Any, count: int, total_bytes: int | None
) -> list[dict[str, Any]]:
    """``count`` tasks of :func:`task_rate` at once in one bundle of one GPU; what each
    returned (a failed task: rate 0 and its error)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    share = 1.0 / count if count > 1 else 1.0
    held = Share(share if count > 1 else 1.0, memory_fraction(share, total_bytes), total_bytes)
    group = placement_group([{"GPU": 1.0, "CPU": float(count)}], strategy="STRICT_PACK")
    barrier = _barrier_class().remote(count)
    try:
        ray.get(group.ready(), timeout=RATE_TIMEOUT_S)
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
        task = ray.remote(num_cpus=1, num_gpus=share, max_retries=0, max_calls=1)(task_rate)
        refs = [
            task.options(scheduling_strategy=strategy).remote(job, config, data, held, barrier)
            for _ in range(count)
        ]
        results = []
        for ref in refs:
            try:
                results.append(ray.get(ref, timeout=RATE_TIMEOUT_S))
            except Exception as exc:  # out of memory at this share: no throughput here
                results.append({"rate": 0.0, "error": one_line(exc, where="last")})
        return results
    finally:
        ray.kill(barrier)
        remove_placement_group(group)


def measure_rates(
    spec: StudySpec,
    data: Any,
    config: Mapping[str, Any],
    fit: int,
    total_bytes: int | None = None,
    tolerance: float = TOLERANCE,
) -> dict[int, float]:
    """Summed images per second of ``config`` by count of trials at once on one GPU, for the
    counts :func:`~search.compute.throughput.next_count` asks for, up to ``fit``.

    ``data``: the trials' data or its holder in Ray's object store (``SharedData``).
    Returns what it measured (empty when the first count failed: memory packing then).
    """
    job = replace(trial_job(spec, data), max_epochs=RATE_EPOCHS)
    shared = getattr(data, "ref", data)
    rates: dict[int, float] = {}
    while (count := next_count(rates, fit, tolerance)) is not None:
        results = measure_count(job, config, shared, count, total_bytes)
        rates[count] = (
            sum(r["rate"] for r in results) if all(r["rate"] > 0 for r in results) else 0.0
        )
        _log.info("gpus_per_trial auto: %d at once: %.0f images/s summed", count, rates[count])
        if rates[count] <= 0:
            errors = [r["error"] for r in results if "error" in r]
            _log.warning(
                "gpus_per_trial auto: %d trials at once did not all train (%s)",
                count,
                errors[0] if errors else "no rate",
            )
            break
    return {k: v for k, v in rates.items() if v > 0}
