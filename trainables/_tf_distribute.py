"""GPU memory caps and multi-GPU strategy for the TensorFlow trainables (not yet wired in).

The PyTorch trainables cap a packed trial's GPU memory and train data-parallel over several
worker processes (:mod:`search.placement`, :mod:`search.distributed`). The TensorFlow
equivalents are one process per trial:

* :func:`configure_gpu_memory` caps each visible GPU at the trial's share
  (``ctx.extras["gpu_memory_fraction"]`` of ``ctx.extras["gpu_total_bytes"]``) through a
  logical device with a memory limit, or turns on memory growth when no cap is set; it must
  run before TensorFlow first touches a GPU (first thing in the trainable);
* :func:`strategy` is ``MirroredStrategy`` over the trial's GPUs when Ray gave it several
  (``gpus_per_trial: 2``: the runner starts one process for a trainable without
  ``DATA_PARALLEL``), else the default strategy; build and compile the model in its scope,
  with the global batch size.

A TensorFlow trainable opts in with two calls; until then TF trials take whole GPUs.
"""

from __future__ import annotations

from typing import Any

from search.trainable import TrialContext


def configure_gpu_memory(ctx: TrialContext) -> str:
    """Caps (or grows) TF's memory on every visible GPU; returns what it did, in words."""
    import tensorflow as tf

    devices = tf.config.list_physical_devices("GPU")
    if not devices:
        return "no GPU"
    fraction = ctx.extras.get("gpu_memory_fraction")
    total = ctx.extras.get("gpu_total_bytes")
    if fraction and total:
        limit_mib = int(float(fraction) * int(total) / 2**20)
        for device in devices:
            tf.config.set_logical_device_configuration(
                device, [tf.config.LogicalDeviceConfiguration(memory_limit=limit_mib)])
        return f"capped at {limit_mib} MiB per GPU"
    for device in devices:
        tf.config.experimental.set_memory_growth(device, True)
    return "memory growth"


def strategy(ctx: TrialContext) -> Any:
    """``MirroredStrategy`` over the trial's GPUs when it has several, else the default."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU") if ctx.device.startswith("cuda") else []
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy([g.name for g in gpus])
    return tf.distribute.get_strategy()
