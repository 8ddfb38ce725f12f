"""Where trials run: CPUs and GPUs per trial, trials per GPU, threads, memory caps.

The spec's ``resources`` block says what the user wants; :func:`resolve` turns it, with the
cluster's resources (and, for ``gpus_per_trial: auto`` on GPUs, a measurement), into a
:class:`Placement`: what Ray reserves per trial, how many trials run at once, how many threads
each process uses, and the memory cap of each trial's process.

``gpus_per_trial: auto``:

* without GPUs in the cluster, trials run on CPUs, as many at once as the cores allow (or
  ``max_concurrent``), each with a thread count equal to its CPU share;
* with GPUs, :func:`measure` runs a few training steps of the largest config of the space
  (largest batch, fp32) on one GPU and reads the peak memory the caching allocator reserved;
  :func:`pack` then decides how many trials fit on one GPU with headroom, and each trial's
  process is capped at its share (``torch.cuda.set_per_process_memory_fraction``, read by the
  trainable from ``ctx.extras["gpu_memory_fraction"]``). A packed trial that still runs out of
  memory is retried by Tune with twice the GPU share (:class:`OomRetry`), not failed.

The arithmetic (:func:`pack`, :func:`grow_share`, :func:`memory_fraction`, :func:`resolve`) is
pure; only :func:`measure` needs CUDA (and on CPU it is never called).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune import Callback

from search.errors import SearchError

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

    from search.data import Dataset
    from search.space import Param
    from search.spec import ResourcesSpec, StudySpec

_log = logging.getLogger(__name__)

GPU_MEMORY_FRACTION = "gpu_memory_fraction"
"""``ctx.extras`` key: the share of the GPU's memory the trial's process may allocate (or None)."""
GPU_SHARE = "gpu_share"
"""``ctx.extras`` key: the share of a GPU Ray reserved for the trial."""
GPU_TOTAL_BYTES = "gpu_total_bytes"
"""``ctx.extras`` key: the measured GPU's memory, when ``auto`` measured one."""
MAX_STEPS = "max_steps"
"""``ctx.extras`` key: train at most this many batches per epoch (the measurement only)."""

CUDA_CONTEXT_BYTES = 512 * 2**20
"""What each CUDA process holds outside PyTorch's caching allocator (context, kernels)."""
CONTEXT_RESERVE = 0.05
"""Share of a GPU kept for the CUDA context when the GPU's size is unknown."""
MAX_TRIALS_PER_GPU = 16
MEASURE_STEPS = 3
MEASURE_TIMEOUT_S = 600.0
OOM_RETRIES = 2
"""Tune retries a packed trial at least this often (each retry doubles its GPU share)."""

_OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "RESOURCE_EXHAUSTED",
                "OOM when allocating", "out of memory")


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


def memory_fraction(share: float, total_bytes: int | None = None,
                    context_bytes: int = CUDA_CONTEXT_BYTES) -> float | None:
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


def pack(peak_bytes: int, total_bytes: int, headroom: float = 0.25,
         context_bytes: int = CUDA_CONTEXT_BYTES,
         max_per_gpu: int = MAX_TRIALS_PER_GPU) -> Packing:
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
        raise ValueError(f"pack: need total > 0, peak >= 0, headroom >= 0; got "
                         f"{total_bytes}, {peak_bytes}, {headroom}")
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


def share_extras(extras: Mapping[str, Any], share: float | None) -> dict[str, Any]:
    """``extras`` for a trial that holds ``share`` of a GPU (a retry may hold more than the
    share planned for it): the memory cap grows in proportion, and vanishes for a whole GPU."""
    out = dict(extras)
    if not share or share <= 0:
        return out
    planned, cap = extras.get(GPU_SHARE), extras.get(GPU_MEMORY_FRACTION)
    if share >= 1.0:
        fraction = None
    elif cap and planned:
        fraction = _floor4(min(float(cap) * share / float(planned), share))
    else:
        fraction = memory_fraction(share, extras.get(GPU_TOTAL_BYTES))
    out.update({GPU_SHARE: share, GPU_MEMORY_FRACTION: fraction})
    return out


@dataclass(frozen=True)
class Measurement:
    """Peak memory of a few training steps of the largest config, on one GPU."""

    peak_bytes: int
    total_bytes: int
    device_name: str = ""


@dataclass(frozen=True)
class Placement:
    """What each trial gets and how many run at once (the resolved ``resources`` block)."""

    cpus_per_trial: float
    gpus_per_trial: float
    concurrency: int
    num_threads: int
    workers: int = 1
    memory_fraction: float | None = None
    packing: Packing | None = None
    total_gpu_bytes: int | None = None
    note: str = ""

    @property
    def ray_resources(self) -> dict[str, float]:
        """The ``tune.with_resources`` request of one trial."""
        return {"cpu": self.cpus_per_trial, "gpu": self.gpus_per_trial}

    def extras(self) -> dict[str, Any]:
        """The trial extras (``ctx.extras``) that carry the GPU share and memory cap."""
        return {GPU_SHARE: self.gpus_per_trial or None, GPU_MEMORY_FRACTION: self.memory_fraction,
                GPU_TOTAL_BYTES: self.total_gpu_bytes}


def resolve(resources: ResourcesSpec, cluster: Mapping[str, float],
            measured: Measurement | None = None, data_parallel: bool = True) -> Placement:
    """The placement of every trial, from the spec's ``resources`` and the cluster's totals.

    Args:
        resources: The spec's ``resources`` block.
        cluster: ``ray.cluster_resources()`` (``CPU`` and ``GPU`` are read).
        measured: For ``gpus_per_trial: auto`` on GPUs, what :func:`measure` found (None:
            one trial per GPU).
        data_parallel: Whether the trainable trains data-parallel over several workers.

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
        return Placement(_floor4(cpt), 0.0, concurrency, threads, note=(
            f"gpus_per_trial auto: no GPU in the cluster; {concurrency} trial(s) at once on "
            f"{cpus:g} CPUs, {threads} thread(s) each"))
    if wanted == "auto":
        cap = limit or max(1, math.floor(cpus / (resources.cpus_per_trial or 1.0) + 1e-9))
        per_gpu_cap = max(1, min(MAX_TRIALS_PER_GPU, math.ceil(cap / gpus)))
        if measured is None:
            packing, why = Packing(1, 1.0, None), "not measured (a PyTorch trainable is needed)"
        else:
            packing = pack(measured.peak_bytes, measured.total_bytes, resources.memory_headroom,
                           max_per_gpu=per_gpu_cap)
            why = (f"largest config peaks at {measured.peak_bytes / 2**20:.0f} MiB of "
                   f"{measured.total_bytes / 2**30:.0f} GiB")
        concurrency = max(1, min(cap, packing.trials_per_gpu * math.floor(gpus)))
        cpt = resources.cpus_per_trial or max(1.0, math.floor(cpus / concurrency))
        return Placement(
            _floor4(cpt), packing.gpu_share, concurrency, max(1, math.floor(cpt + 1e-9)),
            memory_fraction=packing.memory_fraction, packing=packing,
            total_gpu_bytes=measured.total_bytes if measured else None,
            note=(f"gpus_per_trial auto: {why}; {packing.trials_per_gpu} trial(s) per GPU on "
                  f"{gpus:g} GPU(s), {concurrency} at once"))
    if wanted > 0 and gpus <= 0:
        raise PlacementError(
            f"resources.gpus_per_trial: {wanted:g} GPU(s) per trial, but the Ray cluster has no "
            "GPU; use 0 or auto")
    workers = resources.workers_per_trial or (int(wanted) if wanted >= 2 else 1)
    if workers > 1 and not data_parallel:
        if resources.workers_per_trial:
            raise PlacementError(
                f"resources.workers_per_trial: the trainable does not train data-parallel "
                f"(no DATA_PARALLEL in its module), got {workers}")
        workers = 1  # one process holds all the trial's GPUs (TensorFlow: MirroredStrategy)
    cpt = resources.cpus_per_trial or float(workers)
    by_cpu = math.floor(cpus / cpt + 1e-9)
    by_gpu = math.floor(gpus / wanted + 1e-9) if wanted > 0 else by_cpu
    concurrency = limit or max(1, min(by_cpu, by_gpu))
    fraction = memory_fraction(wanted) if 0 < wanted < 1 else None
    return Placement(cpt, wanted, concurrency, max(1, math.floor(cpt / workers + 1e-9)),
                     workers=workers, memory_fraction=fraction)


# ---- the largest config and its measurement (needs CUDA) --------------------------------

_HEAVIEST = {"precision": ("fp32",), "optimizer": ("adamw", "adam"), "cell": ("lstm",)}
"""Choices known to take the most memory; other string choices take their first value."""


def _largest(name: str, param: Param) -> Any:
    kind = param.kind
    if kind in ("uniform", "loguniform", "int"):
        bounds = param.uniform or param.loguniform or param.int_
        return bounds[1] if bounds else None
    if kind == "fixed":
        return param.fixed
    values = list(param.choice or [])
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if numbers and len(numbers) == len(values):
        return max(numbers)
    for preferred in _HEAVIEST.get(name, ()):
        if preferred in values:
            return preferred
    return values[0]


def largest_config(space: Mapping[str, Param], fixed: Mapping[str, Any]) -> dict[str, Any]:
    """The config of ``space`` that takes the most memory, as far as names tell: every number
    at its upper bound (batch size, widths, layers), fp32, the optimizer with most state.

    Example:
        >>> from search.space import Param
        >>> largest_config({"batch_size": Param(choice=[32, 256]),
        ...                 "precision": Param(choice=["bf16", "fp32"]),
        ...                 "momentum": Param(uniform=(0.8, 0.9), when={"optimizer": "sgd"}),
        ...                 "optimizer": Param(choice=["sgd", "adam"])}, {"channels": 16})
        {'channels': 16, 'batch_size': 256, 'precision': 'fp32', 'optimizer': 'adam'}
    """
    from search.space import is_active, order

    params: dict[str, Any] = {}
    for name in order(space):
        if is_active(space[name], params):
            params[name] = _largest(name, space[name])
    return {**fixed, **params}


def measure_peak(trainable: str, config: Mapping[str, Any], data: Dataset,
                 extras: Mapping[str, Any], steps: int = MEASURE_STEPS) -> Measurement | None:
    """Peak GPU memory of ``steps`` training steps of ``config`` (runs where a GPU is).

    Returns None without CUDA, or when the trainable allocates nothing through PyTorch (a
    TensorFlow trainable: it then gets one trial per GPU).
    """
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from search.trainable import TrialContext, resolve_trainable

    train = resolve_trainable(trainable)
    ctx = TrialContext(max_epochs=1, seed=0, num_threads=1, device="cuda",
                       extras={**extras, MAX_STEPS: steps, GPU_MEMORY_FRACTION: None})
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    epochs = train(config, data, ctx)
    try:
        next(iter(epochs), None)
    finally:
        if hasattr(epochs, "close"):
            epochs.close()
    torch.cuda.synchronize()
    peak = int(torch.cuda.max_memory_reserved())
    if peak <= 0:
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return Measurement(peak, int(props.total_memory), str(props.name))


def measure(spec: StudySpec, data: Dataset, extras: Mapping[str, Any]) -> Measurement | None:
    """Runs :func:`measure_peak` of the space's largest config as a Ray task on one GPU.

    Returns None (one trial per GPU) when the measurement fails or times out.
    """
    import ray

    config = largest_config(spec.space, spec.fixed)
    # max_calls=1: the worker exits after the task, and its CUDA context with it
    task = ray.remote(num_gpus=1, num_cpus=1, max_retries=0, max_calls=1)(measure_peak)
    try:
        return ray.get(task.remote(spec.trainable, config, data, dict(extras)),
                       timeout=MEASURE_TIMEOUT_S)
    except Exception as exc:  # a failed measurement must not fail the study
        _log.warning("gpus_per_trial auto: measuring the largest config failed (%s); "
                     "one trial per GPU", str(exc).splitlines()[0] if str(exc) else exc)
        return None


def supports_data_parallel(trainable: str) -> bool:
    """Whether ``trainable``'s module says ``DATA_PARALLEL = True`` (it trains with DDP when
    the runner starts several workers; the PyTorch built-ins do, through ``fit_epochs``)."""
    import sys

    from search.trainable import resolve_trainable

    fn = resolve_trainable(trainable)
    return bool(getattr(sys.modules.get(fn.__module__), "DATA_PARALLEL", False))


# ---- retry with a larger share when a packed trial runs out of memory ------------------

def out_of_memory(text: str) -> bool:
    """Whether an error's text says the GPU ran out of memory (PyTorch or TensorFlow)."""
    return any(marker in text for marker in _OOM_MARKERS)


def _last_error(trial: Trial) -> str:
    path = getattr(trial, "error_file", None)
    if not path or not Path(path).is_file():
        return ""
    text = Path(path).read_text(errors="replace")
    return text.rsplit("Failure # ", 1)[-1]


class OomRetry(Callback):
    """Before Tune retries a trial that ran out of GPU memory, doubles its GPU share.

    Tune calls ``on_trial_recover`` once the failed trial is PENDING again; its resources may
    then change, and the retry starts (from its last checkpoint) in a new actor with the larger
    share, which the worker turns into a larger memory cap (:func:`share_extras`).
    """

    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial,
                         **info: Any) -> None:
        if not out_of_memory(_last_error(trial)):
            return
        factory = trial.placement_group_factory
        required: dict[str, float] = dict(factory.required_resources) if factory else {}
        share = float(required.get("GPU", 0.0))
        if not 0 < share < 1:
            return
        bigger = grow_share(share)
        trial.update_resources({"cpu": float(required.get("CPU", 1.0)), "gpu": bigger})
        _log.warning("trial %s ran out of GPU memory at %.4g of a GPU; retrying with %.4g",
                     trial.trial_id, share, bigger)
