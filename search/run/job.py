"""What every trial of a study shares (:class:`TrialJob`) and the one :class:`TrialContext`
builder, used by Ray trials, confirmation runs, ``train`` and the GPU memory probe."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from search.contract import TrialContext

if TYPE_CHECKING:
    from search.contract import Dataset
    from search.run.placement import Placement
    from search.spec.schema import StudySpec


@dataclass(frozen=True)
class TrialJob:
    """What every trial of a study shares (sent once through Ray's object store).

    Args:
        trainable: The spec's trainable name.
        max_epochs: The epoch budget of one trial.
        metric: The objective metric; an epoch without it as a number fails the trial.
        num_threads: CPU threads each training process uses.
        checkpoints: Whether trials checkpoint each epoch (``faults.checkpoints``).
        workers: Processes that train each trial data-parallel (:mod:`search.run.distributed`).
        extras: What every trial's ``ctx.extras`` holds (:func:`trial_extras`).
    """

    trainable: str
    max_epochs: int
    metric: str = ""
    num_threads: int = 1
    checkpoints: bool = True
    workers: int = 1
    extras: Mapping[str, Any] = field(default_factory=dict)


def trial_extras(
    spec: StudySpec, data: Dataset, placement: Placement | None = None
) -> dict[str, Any]:
    """Spec-level options every trial may read through ``TrialContext.extras``.

    With ``placement``: ``gpu_memory_fraction`` (the cap on the trial's GPU allocator, or
    None), ``gpu_share``, ``gpu_total_bytes`` and ``replicas`` (see :mod:`search.run.placement`).
    """
    return {
        **(placement.extras() if placement else {}),
        "profile": spec.profile,
        "profile_trial": spec.profile_trial,
        "data_path": getattr(data, "path", None),
        "image_size": getattr(data, "image_size", None),
        "val_fraction": spec.data.val_fraction,
        "split_seed": spec.data.split_seed,
    }


def trial_job(spec: StudySpec, data: Any, placement: Placement | None = None) -> TrialJob:
    """The job of ``spec``'s trials; without ``placement``, one process of ``cpus_per_trial``
    threads (a run outside Ray Tune: confirmation, ``train``)."""
    if placement is None:
        threads = max(1, int(spec.resources.cpus_per_trial or 1))
        return TrialJob(
            spec.trainable,
            spec.budget.max_epochs,
            spec.objective.metric,
            threads,
            checkpoints=False,
            extras=trial_extras(spec, data),
        )
    return TrialJob(
        spec.trainable,
        spec.budget.max_epochs,
        spec.objective.metric,
        placement.num_threads,
        checkpoints=spec.faults.checkpoints,
        workers=placement.workers,
        extras=trial_extras(spec, data, placement),
    )


def trial_context(
    job: TrialJob,
    *,
    seed: int,
    number: int = 0,
    device: str = "cpu",
    trial_dir: str = ".",
    extras: Mapping[str, Any] | None = None,
    **fields: Any,
) -> TrialContext:
    """The context a trial of ``job`` gets; ``extras`` are merged over the job's, and
    ``fields`` (``checkpoint_dir``, ``restore_dir``, ``start_epoch``, ``max_epochs``) are
    passed to :class:`TrialContext` as they are.

    Example:
        >>> ctx = trial_context(TrialJob("search.testing:curve", 5), seed=3, extras={"x": 1})
        >>> ctx.max_epochs, ctx.seed, ctx.device, dict(ctx.extras)
        (5, 3, 'cpu', {'x': 1})
    """
    merged = {**job.extras, **(extras or {})}
    return TrialContext(
        max_epochs=fields.pop("max_epochs", job.max_epochs),
        seed=seed,
        num_threads=job.num_threads,
        device="cuda" if device.startswith("cuda") else "cpu",
        trial_number=number,
        trial_dir=trial_dir,
        extras=merged,
        gpu_share=merged.get("gpu_share"),
        gpu_memory_fraction=merged.get("gpu_memory_fraction"),
        data_path=merged.get("data_path"),
        replicas=int(merged.get("replicas") or 1),
        **fields,
    )
