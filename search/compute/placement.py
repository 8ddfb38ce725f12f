"""Where trials run: CPUs and GPUs per trial, trials per GPU, threads, memory caps.

The spec's ``resources`` block says what the user wants; :func:`resolve` turns it, with the
cluster's resources (and, for ``gpus_per_trial: auto`` on GPUs, a measurement), into a
:class:`Placement`: what Ray reserves per trial, how many trials run at once, how many threads
each process uses, and the memory cap of each trial's process.

``gpus_per_trial: auto``:

* without GPUs in the cluster, trials run on CPUs, as many at once as the cores allow (or
  ``max_concurrent``), each with a thread count equal to its CPU share;
* with GPUs, :func:`search.compute.gpu_memory.measure` runs a few training steps of the largest
  config of the space (largest batch, fp32) on one GPU and reads the peak memory the caching
  allocator reserved;
  :func:`pack` then decides how many trials fit on one GPU with headroom;
  :mod:`search.compute.gpu_rates` measures the images per second summed over 1, 2, 4, ... of
  them at once on one GPU, and the fewest within a tolerance of the most are packed
  (:mod:`search.compute.throughput`, :func:`auto_packing`); each trial's
  process is capped at its share (:mod:`search.compute.limits` applies
  ``ctx.gpu_memory_fraction`` for PyTorch and TensorFlow). A packed trial that still runs out
  of memory is retried by Tune with twice the GPU share (:class:`search.tuning.oom.OomRetry`),
  not failed.

Several devices per trial (``gpus_per_trial: 2``, or ``workers_per_trial: 2`` on CPUs) train
one trial data-parallel, the way its trainable declares (``@trainable(data_parallel=...)``, read by
:func:`search.contract.declarations` and passed in): ``True`` (:data:`PROCESSES`) starts one
process per device that join a ``torch.distributed`` group (:mod:`search.compute.distributed`);
``"in_process"`` (:data:`IN_PROCESS`) keeps one process that mirrors the model over the devices
itself (TensorFlow's ``MirroredStrategy``), told how many through ``ctx.replicas``.

What a trial gets of its devices travels as one typed value, :class:`Share`, on the trial's
job (:class:`search.compute.job.TrialJob`) into its context's fields.

The arithmetic (:func:`pack`, :func:`grow_share`, :func:`memory_fraction`, :func:`resolve`,
:func:`one_process`) is pure; the measurement lives in :mod:`search.compute.gpu_memory`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from search.compute.throughput import choose, decision
from search.contract.registry import IN_PROCESS, PROCESSES, ParallelMode
from search.errors import SearchError

if TYPE_CHECKING:
    from search.specs.schema import ResourcesSpec

CUDA_CONTEXT_BYTES = 512 * 2**20
"""What each CUDA process holds outside PyTorch's caching allocator (context, kernels)."""
CONTEXT_RESERVE = 0.05
"""Share of a GPU kept for the CUDA context when the GPU's size is unknown."""
MAX_TRIALS_PER_GPU = 16


class PlacementError(SearchError):
    """The resources asked for cannot be had on this cluster (one line)."""


def _floor4(value: float) -> float:
    """Rounds down to 4 decimals: Ray's resolution for fractional resources."""
    return math.floor(value * 10_000 + 1e-9) / 10_000


@dataclass(frozen=True)
class Packing:
    """How trials share one GPU.

    Attributes:
        trials_per_gpu: How many trials run on one GPU at once.
        gpu_share: Ray's GPU resource per trial (``1 / trials_per_gpu``, rounded down).
        memory_fraction: The cap on each trial's allocator, as a share of the GPU's memory
            (``torch.cuda.set_per_process_memory_fraction``); None when a trial has the GPU.
    """

    trials_per_gpu: int
    gpu_share: float
    memory_fraction: float | None


def memory_fraction(
    share: float, total_bytes: int | None = None, context_bytes: int = CUDA_CONTEXT_BYTES
) -> float | None:
    """The allocator cap of a process that holds ``share`` of a GPU, or None for a whole GPU.

    The CUDA context lives outside the allocator, so it comes off the share: its size when the
    GPU's memory is known, else :data:`CONTEXT_RESERVE` of the GPU.

    Example:
        >>> memory_fraction(0.5, total_bytes=16 * 2**30)
        0.4687
        >>> memory_fraction(1.0) is None
        True
    """
    if share >= 1.0:
        return None
    reserve = context_bytes / total_bytes if total_bytes else CONTEXT_RESERVE
    return _floor4(max(share - reserve, share / 2))


def pack(
    peak_bytes: int,
    total_bytes: int,
    headroom: float = 0.25,
    context_bytes: int = CUDA_CONTEXT_BYTES,
    max_per_gpu: int = MAX_TRIALS_PER_GPU,
) -> Packing:
    """How many trials fit on one GPU, and each one's share and memory cap.

    Each trial needs its measured peak, ``headroom`` of that again (batches of other configs,
    fragmentation, evaluation) and its CUDA context. As many trials as fit in the GPU's memory
    share it, at most ``max_per_gpu``; each one's allocator is capped so that its peak, headroom
    and context stay inside its share.

    Args:
        peak_bytes: Peak memory the largest config reserved in a few training steps.
        total_bytes: The GPU's memory.
        headroom: Extra share of ``peak_bytes`` each trial keeps.
        context_bytes: Memory a CUDA process holds outside the allocator.
        max_per_gpu: Upper bound (CPU cores and the trial budget bound it too).

    Example:
        >>> pack(peak_bytes=2 * 2**30, total_bytes=80 * 2**30, headroom=0.25)
        Packing(trials_per_gpu=16, gpu_share=0.0625, memory_fraction=0.0562)
        >>> pack(peak_bytes=20 * 2**30, total_bytes=80 * 2**30, headroom=0.25)
        Packing(trials_per_gpu=3, gpu_share=0.3333, memory_fraction=0.327)
        >>> pack(peak_bytes=70 * 2**30, total_bytes=80 * 2**30)
        Packing(trials_per_gpu=1, gpu_share=1.0, memory_fraction=None)
    """
    if total_bytes <= 0 or peak_bytes < 0 or headroom < 0:
        raise ValueError(
            f"pack: need total > 0, peak >= 0, headroom >= 0; got "
            f"{total_bytes}, {peak_bytes}, {headroom}"
        )
    need = peak_bytes * (1.0 + headroom) + context_bytes
    trials = max(1, min(int(max_per_gpu), int(total_bytes // need)))
    if trials == 1:
        return Packing(1, 1.0, None)
    share = _floor4(1.0 / trials)
    return Packing(trials, share, memory_fraction(share, total_bytes, context_bytes))


def grow_share(share: float) -> float:
    """The GPU share a trial that ran out of memory is retried with: twice its share.

    Example:
        >>> grow_share(0.0625), grow_share(0.25), grow_share(0.3333), grow_share(1.0)
        (0.125, 0.5, 1.0, 1.0)
    """
    if share <= 0 or share >= 1:
        return 1.0
    trials = max(1, round(1.0 / share))
    return 1.0 if trials // 2 <= 1 else _floor4(1.0 / (trials // 2))


@dataclass(frozen=True)
class Share:
    """A trial's share of its devices: what Ray holds for it and what its process may use.

    It travels typed from :func:`resolve` through :class:`search.compute.job.TrialJob` to the
    trial's :class:`~search.contract.TrialContext` fields, and :mod:`search.compute.limits`
    applies it.

    Attributes:
        gpus: The GPU resource Ray holds for the trial (None: no GPU).
        memory_fraction: The cap on the trial's GPU memory, as a share of the GPU's memory
            (None: no cap, the trial has its GPUs to itself).
        gpu_total_bytes: The GPU's memory, when ``gpus_per_trial: auto`` measured it.
        replicas: Devices an ``in_process`` data-parallel trial mirrors its model over.
    """

    gpus: float | None = None
    memory_fraction: float | None = None
    gpu_total_bytes: int | None = None
    replicas: int = 1

    def holding(self, gpus: float | None) -> Share:
        """This share for a trial that holds ``gpus`` of a GPU (a retry may hold more than the
        share planned for it): the memory cap grows in proportion, and vanishes for a whole GPU.

        Example:
            >>> Share(gpus=0.25, memory_fraction=0.2).holding(0.5).memory_fraction
            0.4
            >>> Share(gpus=0.25, memory_fraction=0.2).holding(1.0).memory_fraction is None
            True
        """
        if not gpus or gpus <= 0:
            return self
        if gpus >= 1.0:
            fraction = None
        elif self.memory_fraction and self.gpus:
            fraction = _floor4(min(self.memory_fraction * gpus / self.gpus, gpus))
        else:
            fraction = memory_fraction(gpus, self.gpu_total_bytes)
        return replace(self, gpus=gpus, memory_fraction=fraction)


@dataclass(frozen=True)
class Measurement:
    """Peak memory of a few training steps of the largest config, on one GPU, and the images
    per second summed over ``count`` such trials at once on it (``rates``: ``(count, rate)``
    pairs, :mod:`search.compute.gpu_rates`; empty: packed by memory)."""

    peak_bytes: int
    total_bytes: int
    device_name: str = ""
    rates: tuple[tuple[int, float], ...] = ()


def per_gpu_cap(resources: ResourcesSpec, cluster: Mapping[str, float]) -> int:
    """The most trials ``auto`` may put on one GPU: :data:`MAX_TRIALS_PER_GPU`, and no more
    than the CPUs (or ``max_concurrent``) allow, spread over every GPU.

    Example:
        >>> from search.specs.schema import ResourcesSpec
        >>> per_gpu_cap(ResourcesSpec(gpus_per_trial="auto"), {"CPU": 16.0, "GPU": 8.0})
        2
    """
    cpus = max(1.0, float(cluster.get("CPU", 1.0)))
    gpus = max(1.0, float(cluster.get("GPU", 1.0)))
    limit = resources.max_concurrent
    cap = limit or max(1, math.floor(cpus / (resources.cpus_per_trial or 1.0) + 1e-9))
    return max(1, min(MAX_TRIALS_PER_GPU, math.ceil(cap / gpus)))


def auto_packing(
    resources: ResourcesSpec, cluster: Mapping[str, float], measured: Measurement | None
) -> tuple[Packing, str]:
    """How ``auto`` packs one GPU, and why in words: one trial without a measurement; as many
    as fit in memory (:func:`pack`) without rates; with rates, the count
    :func:`search.compute.throughput.choose` picks of those that fit."""
    if measured is None:
        return Packing(1, 1.0, None), "not measured (a PyTorch trainable is needed)"
    headroom, cap = resources.memory_headroom, per_gpu_cap(resources, cluster)
    packing = pack(measured.peak_bytes, measured.total_bytes, headroom, max_per_gpu=cap)
    why = (
        f"largest config peaks at {measured.peak_bytes / 2**20:.0f} MiB of "
        f"{measured.total_bytes / 2**30:.0f} GiB"
    )
    if not measured.rates:
        return packing, why
    rates, fit = dict(measured.rates), packing.trials_per_gpu
    chosen = max(1, min(choose(rates), fit))
    packed = pack(measured.peak_bytes, measured.total_bytes, headroom, max_per_gpu=chosen)
    return packed, f"{why}; {decision(rates, fit)}"


@dataclass(frozen=True)
class Placement:
    """What each trial gets and how many run at once (the resolved ``resources`` block)."""

    cpus_per_trial: float
    gpus_per_trial: float
    concurrency: int
    num_threads: int
    workers: int = 1
    replicas: int = 1
    memory_fraction: float | None = None
    packing: Packing | None = None
    total_gpu_bytes: int | None = None
    note: str = ""
    rates: tuple[tuple[int, float], ...] = ()  # auto's images/s by trials at once on one GPU

    @property
    def ray_resources(self) -> dict[str, float]:
        """The ``tune.with_resources`` request of one trial."""
        return {"cpu": self.cpus_per_trial, "gpu": self.gpus_per_trial}

    @property
    def share(self) -> Share:
        """What each trial's process gets of its devices (carried on the trial's job)."""
        return Share(
            self.gpus_per_trial or None,
            self.memory_fraction,
            self.total_gpu_bytes,
            self.replicas,
        )


def one_process(resources: ResourcesSpec) -> Placement:
    """The placement of a run outside Ray Tune (a confirmation run, the final model, ``train``):
    one process, as many threads as ``cpus_per_trial`` (default 1) and, on a fraction of a GPU,
    the memory cap a trial of that share gets. ``gpus_per_trial: auto`` holds no share here
    (:func:`search.handover.export.with_placement` resolves it on the cluster first).

    Example:
        >>> from search.specs.schema import ResourcesSpec
        >>> placed = one_process(ResourcesSpec(cpus_per_trial=2, gpus_per_trial=0.5))
        >>> placed.num_threads, placed.share.gpus, placed.share.memory_fraction
        (2, 0.5, 0.45)
    """
    wanted = resources.gpus_per_trial
    gpus = 0.0 if wanted == "auto" else float(wanted or 0.0)
    cpus = float(resources.cpus_per_trial or 1.0)
    fraction = memory_fraction(gpus) if 0 < gpus < 1 else None
    return Placement(cpus, gpus, 1, max(1, math.floor(cpus + 1e-9)), memory_fraction=fraction)


def resolve(
    resources: ResourcesSpec,
    cluster: Mapping[str, float],
    measured: Measurement | None = None,
    data_parallel: ParallelMode | bool = PROCESSES,
) -> Placement:
    """The placement of every trial, from the spec's ``resources`` and the cluster's totals.

    Args:
        resources: The spec's ``resources`` block.
        cluster: ``ray.cluster_resources()`` (``CPU`` and ``GPU`` are read).
        measured: For ``gpus_per_trial: auto`` on GPUs, what
            :func:`search.compute.gpu_memory.measure` found (None: one trial per GPU).
        data_parallel: How the trainable trains on several devices, as its
            ``@trainable(data_parallel=...)`` declares it (the ``data_parallel`` of
            :func:`search.contract.declarations`); True means :data:`PROCESSES`, False or None
            that it cannot.

    Raises:
        PlacementError: GPUs asked for on a cluster without any; several workers for a
            trainable that cannot use them.
    """
    cpus = max(1.0, float(cluster.get("CPU", 1.0)))
    gpus = float(cluster.get("GPU", 0.0))
    wanted, limit = resources.gpus_per_trial, resources.max_concurrent
    if wanted == "auto" and gpus <= 0:
        cpt = resources.cpus_per_trial or (cpus / limit if limit else 1.0)
        concurrency = limit or max(1, math.floor(cpus / cpt + 1e-9))
        threads = max(1, math.floor(cpt + 1e-9))
        return Placement(
            _floor4(cpt),
            0.0,
            concurrency,
            threads,
            note=(
                f"gpus_per_trial auto: no GPU in the cluster; {concurrency} trial(s) at once on "
                f"{cpus:g} CPUs, {threads} thread(s) each"
            ),
        )
    if wanted == "auto":
        cap = limit or max(1, math.floor(cpus / (resources.cpus_per_trial or 1.0) + 1e-9))
        packing, why = auto_packing(resources, cluster, measured)
        concurrency = max(1, min(cap, packing.trials_per_gpu * math.floor(gpus)))
        cpt = resources.cpus_per_trial or max(1.0, math.floor(cpus / concurrency))
        return Placement(
            _floor4(cpt),
            packing.gpu_share,
            concurrency,
            max(1, math.floor(cpt + 1e-9)),
            memory_fraction=packing.memory_fraction,
            packing=packing,
            total_gpu_bytes=measured.total_bytes if measured else None,
            rates=measured.rates if measured else (),
            note=(
                f"gpus_per_trial auto: {why}; {packing.trials_per_gpu} trial(s) per GPU on "
                f"{gpus:g} GPU(s), {concurrency} at once"
            ),
        )
    if wanted > 0 and gpus <= 0:
        raise PlacementError(
            f"resources.gpus_per_trial: {wanted:g} GPU(s) per trial, but the Ray cluster has no "
            "GPU; use 0 or auto"
        )
    devices = resources.workers_per_trial or (int(wanted) if wanted >= 2 else 1)
    workers, replicas = _split_devices(devices, data_parallel, bool(resources.workers_per_trial))
    cpt = resources.cpus_per_trial or float(devices if devices > 1 else 1)
    by_cpu = math.floor(cpus / cpt + 1e-9)
    by_gpu = math.floor(gpus / wanted + 1e-9) if wanted > 0 else by_cpu
    concurrency = limit or max(1, min(by_cpu, by_gpu))
    fraction = memory_fraction(wanted) if 0 < wanted < 1 else None
    return Placement(
        cpt,
        wanted,
        concurrency,
        max(1, math.floor(cpt / workers + 1e-9)),
        workers=workers,
        replicas=replicas,
        memory_fraction=fraction,
    )


def _split_devices(devices: int, mode: ParallelMode | bool, asked: bool) -> tuple[int, int]:
    """``(processes, replicas per process)`` for a trial on ``devices`` devices."""
    if devices <= 1:
        return 1, 1
    if mode is True or mode == PROCESSES:
        return devices, 1
    if mode == IN_PROCESS:
        return 1, devices
    if asked:
        raise PlacementError(
            f"resources.workers_per_trial: the trainable does not train data-parallel "
            f"(no @trainable(data_parallel=...) on it), got {devices}"
        )
    return 1, 1  # one process holds all the trial's GPUs and uses what it can
