"""GPU memory of packed trials: measure the largest config of a space on one GPU.

For ``gpus_per_trial: auto`` on GPUs, :func:`measure` runs a few training steps of the
space's largest config (:func:`largest_config`: every number at its upper bound, so the
largest batch; fp32; the optimizer with most state) as a Ray task on one GPU and reads the
peak memory PyTorch's caching allocator reserved; :func:`search.compute.placement.pack` turns
that into trials per GPU. A packed trial that still runs out of memory is retried by Tune with
twice its GPU share (:class:`search.tuning.oom.OomRetry`, the part that needs Ray Tune).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import closing
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from search.compute.job import TrialJob, trial_context, trial_job
from search.compute.limits import prepare
from search.compute.placement import Measurement
from search.contract import drive
from search.errors import one_line
from search.specs.space import is_active, order

if TYPE_CHECKING:
    from search.contract import Dataset
    from search.specs.schema import StudySpec
    from search.specs.space import Param

_log = logging.getLogger(__name__)

MEASURE_STEPS = 3
MEASURE_TIMEOUT_S = 600.0


# ---- the largest config and its measurement (needs CUDA) ---------------------------------

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
        >>> from search.specs.space import Param
        >>> largest_config({"batch_size": Param(choice=[32, 256]),
        ...                 "precision": Param(choice=["bf16", "fp32"]),
        ...                 "momentum": Param(uniform=(0.8, 0.9), when={"optimizer": "sgd"}),
        ...                 "optimizer": Param(choice=["sgd", "adam"])}, {"channels": 16})
        {'channels': 16, 'batch_size': 256, 'precision': 'fp32', 'optimizer': 'adam'}
    """
    params: dict[str, Any] = {}
    for name in order(space):
        if is_active(space[name], params):
            params[name] = _largest(name, space[name])
    return {**fixed, **params}


def measure_peak(
    job: TrialJob, config: Mapping[str, Any], data: Dataset, steps: int = MEASURE_STEPS
) -> Measurement | None:
    """Peak GPU memory of ``steps`` training steps of ``config``, a trial of ``job`` on a whole
    GPU (runs where a GPU is).

    Returns None without CUDA, or when the trainable allocates nothing through PyTorch (a
    TensorFlow trainable: it then gets one trial per GPU).
    """
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    ctx = trial_context(job, seed=0, device="cuda", max_steps=steps)
    declared, _ = prepare(job.trainable, ctx)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    with closing(drive(declared.train(config, data, ctx), max_epochs=1)) as run:
        next(run, None)
    torch.cuda.synchronize()
    peak = int(torch.cuda.max_memory_reserved())
    if peak <= 0:
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return Measurement(peak, int(props.total_memory), str(props.name))


def measure(spec: StudySpec, data: Any) -> Measurement | None:
    """Runs :func:`measure_peak` of the space's largest config as a Ray task on one GPU.

    ``data``: the trials' data, or a holder of it in Ray's object store with ``ref`` and
    ``path`` attributes (``search.compute.data.SharedData``), which the task reads without a copy.

    Returns None (one trial per GPU) when the measurement fails or times out.
    """
    import ray

    config = largest_config(spec.space, spec.fixed)
    job = replace(trial_job(spec, data), max_epochs=1)  # one process, the whole GPU, no cap
    # max_calls=1: the worker exits after the task, and its CUDA context with it
    task = ray.remote(num_gpus=1, num_cpus=1, max_retries=0, max_calls=1)(measure_peak)
    try:
        return ray.get(
            task.remote(job, config, getattr(data, "ref", data)), timeout=MEASURE_TIMEOUT_S
        )
    except Exception as exc:  # a failed measurement must not fail the study
        _log.warning(
            "gpus_per_trial auto: measuring the largest config failed (%s); one trial per GPU",
            one_line(exc, where="first"),
        )
        return None
