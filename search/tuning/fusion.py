"""Fused trial arrays in a run (``resources.fuse``: N or ``auto``): trials of one shape train
as one model.

Each trial stays a Ray Tune trial: the bridge, ASHA, the record and the console see it as
today. What changes is what its process runs. Instead of the built-in, a light member
(:func:`member_trainable`, no PyTorch import) joins the device's host, an actor that trains
up to N members of one shape together (``trainables/torch/fused_host.py``), asks for its
next epoch, and yields it; the worker reports it as any epoch. A member that ends (its last
epoch, an early stop, ASHA's stop, a NaN, a failure) leaves, and the next trial takes its slot.

Placement: one host per device (each GPU of the cluster, else one for the CPUs), holding
what the unfused trials would have held together; N members per host run at once, each
member's own process holding a sliver of a CPU (:data:`MEMBER_CPUS`).

Not fused yet, by design of this first step: the members write no checkpoint (a retried
member starts again from its first epoch), and only the built-ins of :data:`FUSABLE` fuse.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from search.compute.placement import Placement, Share
from search.contract import TrialContext, hand_over, trainable
from search.contract.registry import BUILTIN_KNOBS, declarations, declared_defaults
from search.pytorch import FUSE_BUILD
from search.tuning.fate import NUMBER
from search.tuning.fusion_actor import HostActor

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

    from search.compute.data import SharedData
    from search.compute.job import TrialJob
    from search.specs.schema import StudySpec

FUSABLE: dict[str, str] = {"torch_cnn": "trainables.torch.cnn:build_model"}
"""The built-ins whose trials fuse, and their model builders."""
HOST = "trainables.torch.fused_host:Host"
MEMBER_CPUS = 0.01
"""What one member's process holds in Ray: it only waits on its host (and on a GPU the
sliver of :func:`member_share`)."""


@dataclass(frozen=True)
class Fusion:
    """The run's hosts: their actor names, how many members each trains at once, the GPU
    share each member's process holds (0 on CPUs: :func:`member_share`), and on GPUs which
    host trains on which of Ray's GPU ids."""

    hosts: tuple[str, ...]
    members: int
    member_gpus: float = 0.0
    by_gpu: tuple[tuple[str, str], ...] = ()

    def host_for(self, number: int, gpu_ids: list[Any] | tuple[Any, ...] = ()) -> str:
        """The host a trial joins: the one on the GPU Ray gave the trial's process (so the
        trial records the GPU it trains on), else by the trial's number.

        Example:
            >>> fusion = Fusion(("h0", "h1"), 4, 0.01, (("3", "h1"), ("5", "h0")))
            >>> fusion.host_for(0, [3]), fusion.host_for(0), fusion.host_for(1)
            ('h1', 'h0', 'h1')
        """
        hosts = dict(self.by_gpu)
        if gpu_ids and str(gpu_ids[0]) in hosts:
            return hosts[str(gpu_ids[0])]
        return self.hosts[number % len(self.hosts)]


def member_share(members: int) -> float:
    """The GPU share of one member's process on a GPU (its host holds the rest of the GPU):
    Ray then puts the member on its host's GPU and the trial records that GPU.

    Example:
        >>> member_share(8), member_share(200)
        (0.01, 0.0025)
    """
    return round(min(0.01, 0.5 / members), 4)


def refusal(spec: StudySpec) -> str | None:
    """Why ``spec`` cannot fuse (one line), or ``None``.

    Example:
        >>> from search.specs.schema import parse_spec
        >>> spec = parse_spec({"study": "s", "trainable": "search.testing:curve",
        ...                    "objective": {"metric": "val_loss", "mode": "min"},
        ...                    "space": {"x": {"uniform": [0.0, 1.0]}},
        ...                    "resources": {"fuse": 4}})
        >>> refusal(spec)[:60]
        "resources.fuse: trainable 'search.testing:curve' does not fu"
    """
    if spec.resources.fuse in (None, "auto"):  # auto fuses only what fuses
        return None
    if builder(spec.trainable) is None:
        known = ", ".join(FUSABLE)
        return (
            f"resources.fuse: trainable {spec.trainable!r} does not fuse; expected one of "
            f"{known}, a trainable made by search.pytorch.sequential, or fuse: off"
        )
    if (spec.resources.workers_per_trial or 1) > 1:
        return "resources.fuse: a fused array trains on one device; set workers_per_trial: 1"
    return None


def micro_batch(spec: StudySpec) -> int | None:
    """The images a fused step takes from each member: the greatest common divisor of the
    batch sizes the space chooses from, so every one of them fuses (a member of a larger
    batch sums its gradient over several steps); ``None`` where the space does not choose
    the batch size among whole numbers (each batch size then an array of its own).

    Example:
        >>> from search.specs.schema import parse_spec
        >>> spec = parse_spec({"study": "s", "trainable": "torch_cnn",
        ...     "objective": {"metric": "val_loss", "mode": "min"},
        ...     "space": {"batch_size": {"choice": [32, 64, 128, 256]}}})
        >>> micro_batch(spec)
        32
    """
    param = spec.space.get("batch_size")
    choices = param.choice if param is not None else None
    if not choices or not all(isinstance(c, int) and not isinstance(c, bool) for c in choices):
        return None
    return math.gcd(*choices)


def builder(name: str) -> str | None:
    """``module:function`` that builds one member's model for trainable ``name`` (a built-in
    of :data:`FUSABLE`, or a trainable of :func:`search.pytorch.sequential`: imported), or
    ``None`` when its trials do not fuse."""
    if name in FUSABLE:
        return FUSABLE[name]
    if name in BUILTIN_KNOBS:
        return None
    found: str | None = getattr(declarations(name).train, FUSE_BUILD, None)
    return found


def start_hosts(
    spec: StudySpec, placement: Placement, data: SharedData, run_id: str, members: int
) -> tuple[Fusion, list[Any]]:
    """Starts one host per device for arrays of up to ``members`` trials, each holding what
    ``placement``'s trials would have held together on it; returns the run's :class:`Fusion`
    and the actors (kept by the driver: they end with it)."""
    import ray

    gpus = int(ray.cluster_resources().get("GPU", 0)) if placement.gpus_per_trial else 0
    count = max(1, gpus)
    held = placement.cpus_per_trial * placement.concurrency / count  # the unfused trials' CPUs
    cpus = max(MEMBER_CPUS, held - members * MEMBER_CPUS)  # and room for the members'
    threads = max(1, round(held))
    build, knobs = builder(spec.trainable), dict(declared_defaults(spec.trainable) or {})
    share = member_share(members) if gpus else 0.0
    held_there = {"num_cpus": cpus, "num_gpus": 1 - members * share if gpus else 0}
    calls = 2 * members + 8  # every member's join, next and leave may wait on the host at once
    names: list[str] = []
    actors: list[Any] = []
    for i in range(count):
        name = f"search-fuse-{run_id}-{i}"
        host = ray.remote(HostActor).options(name=name, max_concurrency=calls, **held_there)
        device = "cuda" if gpus else "cpu"
        actors.append(
            host.remote(HOST, build, knobs, data.ref, members, threads, device, micro_batch(spec))
        )
        names.append(name)
    on = ray.get([actor.gpu.remote() for actor in actors]) if gpus else [None] * count
    by_gpu = tuple((str(g), n) for g, n in zip(on, names, strict=True) if g is not None)
    return Fusion(tuple(names), members, share, by_gpu), actors


def stop_hosts(actors: list[Any]) -> None:
    """Ends the run's hosts (their members have all left)."""
    if actors:
        import ray

        for actor in actors:
            ray.kill(actor)


def member_placement(placement: Placement, fusion: Fusion) -> Placement:
    """The members' placement: N per host at once, each holding :data:`MEMBER_CPUS`."""
    return dataclasses.replace(
        placement,
        cpus_per_trial=MEMBER_CPUS,
        gpus_per_trial=fusion.member_gpus,
        concurrency=fusion.members * len(fusion.hosts),
        num_threads=1,
        memory_fraction=None,
        note=(
            f"resources.fuse: {fusion.members} trials per array, "
            f"{len(fusion.hosts)} host(s) ({placement.concurrency} unfused trials' devices)"
        ),
    )


def member_job(job: TrialJob, fusion: Fusion, defaults: Mapping[str, Any]) -> TrialJob:
    """``job`` with the member trainable in place of the built-in (handed over with the job)."""
    member = member_trainable(fusion, defaults)
    name = hand_over(member)
    return dataclasses.replace(
        job, trainable=name, handed=(*job.handed, (name, member)), share=Share(), checkpoints=False
    )


def member_trainable(fusion: Fusion, defaults: Mapping[str, Any]) -> Any:
    """The trainable each fused trial's process runs: join the host, yield what it trains."""

    @trainable(defaults=dict(defaults))
    def fused_member(
        config: Mapping[str, Any], data: Any, ctx: TrialContext
    ) -> Iterator[dict[str, float]]:
        import ray

        host = fusion.host_for(ctx.trial_number, ray.get_gpu_ids())
        yield from _member(host, config, ctx)

    return fused_member


def _member(host_name: str, config: Mapping[str, Any], ctx: TrialContext) -> Iterator[Any]:
    import ray

    host = ray.get_actor(host_name)
    number = ctx.trial_number
    ray.get(host.join.remote(number, dict(config), ctx.seed, ctx.max_epochs))
    try:
        while True:
            answer = ray.get(host.next.remote(number))
            if answer is None:
                return
            row, last = answer
            yield {k: v for k, v in row.items() if k != "epoch"}
            if last:
                return
    finally:
        host.leave.remote(number)


def leave_callback(fusion: Fusion) -> Any:
    """A Tune callback that frees a trial's slot when Tune ends it (ASHA's stop, a failure),
    whether or not its process got to say so."""
    from ray.tune import Callback

    class LeaveArray(Callback):  # type: ignore[misc]
        def _leave(self, trial: Trial) -> None:
            import ray

            number = trial.config.get(NUMBER)
            for name in fusion.hosts if number is not None else ():  # leave where it sat
                ray.get_actor(name).leave.remote(int(number))

        def on_trial_complete(
            self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
        ) -> None:
            self._leave(trial)

        def on_trial_error(
            self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
        ) -> None:
            self._leave(trial)

    return LeaveArray()
