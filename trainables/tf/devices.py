"""Which devices a TensorFlow trial trains on: its replicas and its distribution strategy.

The framework sets up TensorFlow's devices before the trainable runs
(:mod:`search.compute.limits`, the one place for it): the thread pools get the trial's CPU
share, a ``cpu`` trial sees no GPU, a trial packed onto a shared GPU gets a logical GPU of its
memory cap, others memory growth, and an ``in_process`` trial on CPUs as many logical CPU
devices as it has replicas. This module only reads what that left:

* **Replicas.** A trial placed on several devices (``ctx.replicas``: the runner's
  ``gpus_per_trial: 2`` or ``workers_per_trial: 2``; the TF trainables say
  ``data_parallel="in_process"``) trains data-parallel in this one process:
  :func:`strategy` is a ``MirroredStrategy`` over the trial's GPUs, or, on a machine without
  GPUs, over as many logical CPU devices (how the tests exercise it). The model is built and
  compiled in its scope; ``batch_size`` stays the global batch, which Keras splits evenly over
  the replicas, and the learning rate is left as the space says (as the DDP path does).
"""

from __future__ import annotations

import tensorflow as tf

from search import TrialContext


def replicas(ctx: TrialContext) -> int:
    """How many devices the placement gave this trial to train on in one process."""
    return max(1, ctx.replicas)


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
