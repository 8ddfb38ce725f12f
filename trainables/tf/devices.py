"""Which devices a TensorFlow trial trains on: thread pools, GPU memory, replicas, strategy.

TensorFlow fixes its devices when its runtime starts, so :func:`configure` runs first in
every TF trainable (:func:`trainables.tf.common.setup`, which also returns :func:`strategy`)
and only once per process: a reused trial process keeps the first trial's settings, which is
right because every trial of a study gets the same placement.

* **CPU threads.** The intra- and inter-op pools get the trial's CPU share
  (``ctx.num_threads``). A ``cpu`` trial hides the GPUs.
* **GPU memory.** A trial packed onto a shared GPU (``ctx.gpu_memory_fraction`` of
  ``ctx.gpu_total_bytes``, set by :mod:`search.compute.placement`) gets a logical GPU with
  that memory limit, so it cannot starve its neighbours; otherwise memory growth, so TF does
  not grab the whole card.
* **Replicas.** A trial placed on several devices (``ctx.replicas``: the runner's
  ``gpus_per_trial: 2`` or ``workers_per_trial: 2``; the TF trainables say
  ``data_parallel="in_process"``) trains data-parallel in this one process:
  :func:`strategy` is a ``MirroredStrategy`` over the trial's GPUs, or, on a machine without
  GPUs, over as many logical CPU devices (how the tests exercise it). The model is built and
  compiled in its scope; ``batch_size`` stays the global batch, which Keras splits evenly over
  the replicas, and the learning rate is left as the space says (as the DDP path does).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from search import TrialContext

_configured: dict[str, Any] = {}


def replicas(ctx: TrialContext) -> int:
    """How many devices the placement gave this trial to train on in one process."""
    return max(1, ctx.replicas)


def _gpu_memory(ctx: TrialContext, gpus: list[Any]) -> str:
    fraction, total = ctx.gpu_memory_fraction, ctx.gpu_total_bytes
    if fraction and total:
        limit_mib = int(float(fraction) * int(total) / 2**20)
        for gpu in gpus:
            tf.config.set_logical_device_configuration(
                gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit_mib)]
            )
        return f"capped at {limit_mib} MiB per GPU"
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    return "memory growth"


def _cpu_replicas(count: int) -> str:
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
    )
    return f"{count} logical CPU devices"


def configure(ctx: TrialContext) -> str:
    """Sets threads, GPU memory and CPU replicas, once per process, before any TF op runs.

    Returns:
        What it did, in words (or what the first call did, on later calls).
    """
    if _configured:
        return str(_configured["done"])
    threads, count = max(1, int(ctx.num_threads)), replicas(ctx)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
        gpus = tf.config.list_physical_devices("GPU")
        if not ctx.device.startswith("cuda") or not gpus:
            tf.config.set_visible_devices([], "GPU")
            done = _cpu_replicas(count) if count > 1 else "CPU"
        else:
            done = _gpu_memory(ctx, gpus)
    except RuntimeError:  # the runtime already started (TF used before the first trial)
        done = "kept (TensorFlow had started)"
    _configured["done"] = f"{threads} thread(s), {done}"
    return str(_configured["done"])


def strategy(ctx: TrialContext) -> tf.distribute.Strategy:
    """``MirroredStrategy`` over the trial's devices when it has several, else the default.

    Example:
        >>> with strategy(ctx).scope():  # doctest: +SKIP
        ...     model = build_model(cfg); model.compile(...)
    """
    kind = "GPU" if ctx.device.startswith("cuda") else "CPU"
    devices = [d.name for d in tf.config.list_logical_devices(kind)]
    if kind == "CPU":
        devices = devices[: replicas(ctx)]
    if len(devices) > 1:
        return tf.distribute.MirroredStrategy(devices)
    return tf.distribute.get_strategy()
