"""What every trial of a study shares (:class:`TrialJob`) and the one :class:`TrialContext`
builder, used by Ray trials, confirmation runs, ``train`` and the GPU memory probe."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from search.compute.placement import GPU_MEMORY_FRACTION, GPU_SHARE, GPU_TOTAL_BYTES, REPLICAS
from search.contract import TrialContext

if TYPE_CHECKING:
    from search.compute.placement import Placement
    from search.spec.schema import StudySpec


PROFILE, PROFILE_TRIAL, DATA_PATH = "profile", "profile_trial", "data_path"
"""Keys of :func:`trial_extras` besides :meth:`search.compute.placement.Placement.extras`."""


@dataclass(frozen=True)
class TrialJob:
    """What every trial of a study shares (sent once through Ray's object store).

    Args:
        trainable: The spec's trainable name.
        max_epochs: The epoch budget of one trial.
        metric: The objective metric; an epoch without it as a number fails the trial.
        objectives: The other objectives of a multi-objective study (required the same way).
        num_threads: CPU threads each training process uses.
        checkpoints: Whether trials checkpoint each epoch (``faults.checkpoints``).
        checkpoint_every_s: Least seconds of an attempt before its state becomes a Tune
            checkpoint, and between two (``faults.checkpoint_every_s``).
        workers: Processes that train each trial data-parallel (:mod:`search.compute.distributed`).
        extras: What every trial is told (:func:`trial_extras`).
    """

    trainable: str
    max_epochs: int
    metric: str = ""
    num_threads: int = 1
    checkpoints: bool = True
    checkpoint_every_s: float = 30.0
    workers: int = 1
    extras: Mapping[str, Any] = field(default_factory=dict)
    objectives: tuple[str, ...] = ()

    @property
    def required(self) -> tuple[str, ...]:
        """Every metric each epoch must yield as a number: the objective(s)."""
        return tuple(m for m in (self.metric, *self.objectives) if m)


def trial_extras(spec: StudySpec, data: Any, placement: Placement | None = None) -> dict[str, Any]:
    """What the framework tells every trial, carried to :func:`trial_context`, which turns
    it into :class:`TrialContext` fields.

    With ``placement``: ``gpu_memory_fraction`` (the cap on the trial's GPU allocator, or
    None), ``gpu_share``, ``gpu_total_bytes`` and ``replicas`` (:mod:`search.compute.placement`).
    """
    return {
        **(placement.extras() if placement else {}),
        PROFILE: spec.profile,
        PROFILE_TRIAL: spec.profile_trial,
        DATA_PATH: getattr(data, "path", None),
    }


def trial_job(spec: StudySpec, data: Any, placement: Placement | None = None) -> TrialJob:
    """The job of ``spec``'s trials; without ``placement``, one process of ``cpus_per_trial``
    threads (a run outside Ray Tune: confirmation, ``train``)."""
    if placement is None:
        threads = max(1, int(spec.resources.cpus_per_trial or 1))
        return TrialJob(
            spec.trainable,
            spec.budget.max_epochs,
            spec.primary.metric,
            threads,
            checkpoints=False,
            extras=trial_extras(spec, data),
            objectives=_others(spec),
        )
    return TrialJob(
        spec.trainable,
        spec.budget.max_epochs,
        spec.primary.metric,
        placement.num_threads,
        checkpoints=spec.faults.checkpoints,
        checkpoint_every_s=spec.faults.checkpoint_every_s,
        workers=placement.workers,
        extras=trial_extras(spec, data, placement),
        objectives=_others(spec),
    )


def _others(spec: StudySpec) -> tuple[str, ...]:
    return tuple(o.metric for o in spec.objectives[1:])


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
    """The context a trial of ``job`` gets: ``extras`` (merged over the job's) become typed
    fields, and ``fields`` (``checkpoint_dir``, ``restore_dir``, ``start_epoch``,
    ``max_epochs``, ``max_steps``, ``history``) are passed to :class:`TrialContext` as they are.

    Example:
        >>> job = TrialJob("search.testing:curve", 5, extras={"profile": True})
        >>> ctx = trial_context(job, seed=3, number=0, extras={"gpu_share": 0.5})
        >>> ctx.max_epochs, ctx.seed, ctx.device, ctx.gpu_share, ctx.profile, dict(ctx.extras)
        (5, 3, 'cpu', 0.5, True, {})
    """
    told = {**job.extras, **(extras or {})}
    total = told.get(GPU_TOTAL_BYTES)
    return TrialContext(
        max_epochs=fields.pop("max_epochs", job.max_epochs),
        seed=seed,
        num_threads=job.num_threads,
        device="cuda" if device.startswith("cuda") else "cpu",
        trial_number=number,
        trial_dir=trial_dir,
        gpu_share=told.get(GPU_SHARE),
        gpu_memory_fraction=told.get(GPU_MEMORY_FRACTION),
        gpu_total_bytes=int(total) if total else None,
        data_path=told.get(DATA_PATH),
        replicas=int(told.get(REPLICAS) or 1),
        profile=bool(told.get(PROFILE)) and number == int(told.get(PROFILE_TRIAL) or 0),
        **fields,
    )
