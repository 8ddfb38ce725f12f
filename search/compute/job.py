"""What every trial of a study shares (:class:`TrialJob`) and the one :class:`TrialContext`
builder, used by Ray trials, confirmation runs, ``train`` and the GPU memory probe.

Every value a trial is told is a typed field here, turned into the matching
:class:`TrialContext` field by :func:`trial_context`: nothing goes through a dict of names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from search.compute.placement import Share, one_process
from search.contract import HANDED, TrialContext

if TYPE_CHECKING:
    from search.compute.placement import Placement
    from search.specs.schema import StudySpec


@dataclass(frozen=True)
class TrialJob:
    """What every trial of a study shares (sent once through Ray's object store).

    Args:
        trainable: The spec's trainable name.
        max_epochs: The epoch budget of one trial.
        metric: The objective metric; an epoch without it as a number fails the trial.
        num_threads: CPU threads each training process uses.
        checkpoints: Whether trials checkpoint each epoch (``faults.checkpoints``).
        checkpoint_every_s: Least seconds of an attempt before its state becomes a Tune
            checkpoint, and between two (``faults.checkpoint_every_s``).
        workers: Processes that train each trial data-parallel (:mod:`search.compute.distributed`).
        objectives: The other objectives of a multi-objective study (required the same way).
        share: What each trial gets of its devices (:class:`search.compute.placement.Share`).
        data_path: The folder of an ``image_folder`` dataset (``ctx.data_path``).
        profile: Whether trial number ``profile_trial`` profiles itself (the spec's ``profile``).
        profile_trial: The trial that profiles itself, when ``profile``.
        handed: The functions handed over from Python in the driver (a notebook's trainable,
            by name: :func:`search.contract.registry.hand_over`), shipped with the job.
    """

    trainable: str
    max_epochs: int
    metric: str = ""
    num_threads: int = 1
    checkpoints: bool = True
    checkpoint_every_s: float = 30.0
    workers: int = 1
    objectives: tuple[str, ...] = ()
    share: Share = field(default_factory=Share)
    data_path: str | None = None
    profile: bool = False
    profile_trial: int = 0
    handed: tuple[tuple[str, Any], ...] = ()

    @property
    def required(self) -> tuple[str, ...]:
        """Every metric each epoch must yield as a number: the objective(s)."""
        return tuple(m for m in (self.metric, *self.objectives) if m)


def trial_job(spec: StudySpec, data: Any, placement: Placement | None = None) -> TrialJob:
    """The job of ``spec``'s trials on ``placement``; without it, a run outside Ray Tune
    (confirmation, the final model, ``train``): one process
    (:func:`search.compute.placement.one_process`), no checkpoints, no profile."""
    tuned = placement is not None
    placed = placement or one_process(spec.resources)
    return TrialJob(
        spec.trainable,
        spec.budget.max_epochs,
        spec.primary.metric,
        placed.num_threads,
        checkpoints=tuned and spec.faults.checkpoints,
        checkpoint_every_s=spec.faults.checkpoint_every_s,
        workers=placed.workers,
        objectives=tuple(o.metric for o in spec.objectives[1:]),
        share=placed.share,
        data_path=getattr(data, "path", None),
        profile=tuned and bool(spec.profile),
        profile_trial=int(spec.profile_trial or 0),
        handed=tuple(HANDED.items()),
    )


def trial_context(
    job: TrialJob,
    *,
    seed: int,
    number: int = 0,
    device: str = "cpu",
    trial_dir: str = ".",
    share: Share | None = None,
    **fields: Any,
) -> TrialContext:
    """The context a trial of ``job`` gets: the job's typed values become its fields, with
    ``share`` in place of the job's (a retry may hold more of a GPU), and ``fields``
    (``checkpoint_dir``, ``restore_dir``, ``start_epoch``, ``max_epochs``, ``max_steps``,
    ``history``) passed to :class:`TrialContext` as they are.

    Example:
        >>> job = TrialJob("search.testing:curve", 5, profile=True)
        >>> ctx = trial_context(job, seed=3, number=0, share=Share(gpus=0.5))
        >>> ctx.max_epochs, ctx.seed, ctx.device, ctx.gpu_share, ctx.profile, dict(ctx.extras)
        (5, 3, 'cpu', 0.5, True, {})
    """
    held = share or job.share
    return TrialContext(
        max_epochs=fields.pop("max_epochs", job.max_epochs),
        seed=seed,
        num_threads=job.num_threads,
        device="cuda" if device.startswith("cuda") else "cpu",
        trial_number=number,
        trial_dir=trial_dir,
        gpu_share=held.gpus,
        gpu_memory_fraction=held.memory_fraction,
        gpu_total_bytes=held.gpu_total_bytes,
        data_path=job.data_path,
        replicas=max(1, held.replicas),
        profile=job.profile and number == job.profile_trial,
        **fields,
    )
