"""What the framework applies in a trial's process before the trainable runs: its threads and,
on a shared GPU, its memory cap. A user's trainable gets both without code of its own.

* Threads: ``OMP_NUM_THREADS`` (and ``MKL_NUM_THREADS``) for libraries that start later; and
  ``torch.set_num_threads`` or TensorFlow's thread pools when the trainable's module already
  imported that framework (importing one here would cost seconds a trial that needs none).
* GPU memory of a packed trial (``ctx.gpu_memory_fraction``): PyTorch reads the cap from
  ``PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:F`` when it first touches CUDA, so it
  holds whenever the trainable imports torch; a process that already set CUDA up gets
  ``torch.cuda.set_per_process_memory_fraction``. TensorFlow gets a logical device of that
  size when the GPU's size is known, else memory growth, if it has not set its GPUs up yet.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from search.contract import TrialContext

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
FRACTION_KEY = "per_process_memory_fraction"


def _with_fraction(conf: str, fraction: float) -> str:
    """``conf`` (comma-separated ``key:value``) with the memory fraction set to ``fraction``.

    Example:
        >>> _with_fraction("expandable_segments:True", 0.45)
        'expandable_segments:True,per_process_memory_fraction:0.45'
    """
    parts = [p for p in conf.split(",") if p and not p.startswith(f"{FRACTION_KEY}:")]
    return ",".join([*parts, f"{FRACTION_KEY}:{fraction:g}"])


def apply_limits(ctx: TrialContext) -> dict[str, Any]:
    """Applies ``ctx``'s threads and GPU memory cap to this process; returns what it applied
    (recorded on the trial as the user attribute ``limits``)."""
    applied: dict[str, Any] = {"threads": ctx.num_threads}
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(ctx.num_threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(max(1, ctx.num_threads))
    fraction = ctx.gpu_memory_fraction if ctx.device == "cuda" else None
    if fraction:
        os.environ[ALLOC_CONF] = _with_fraction(os.environ.get(ALLOC_CONF, ""), fraction)
        applied["gpu_memory_fraction"] = fraction
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.set_per_process_memory_fraction(fraction)
    if "tensorflow" in sys.modules:
        _tensorflow(ctx, fraction, applied)
    return applied


def _tensorflow(ctx: TrialContext, fraction: float | None, applied: dict[str, Any]) -> None:
    """Threads and GPU memory for TensorFlow, when it has not initialised yet (it refuses
    both afterwards: then nothing is applied, and the trainable's own settings hold)."""
    import tensorflow as tf

    with contextlib.suppress(RuntimeError):
        tf.config.threading.set_intra_op_parallelism_threads(max(1, ctx.num_threads))
        tf.config.threading.set_inter_op_parallelism_threads(max(1, ctx.num_threads))
    total = ctx.gpu_total_bytes
    for gpu in tf.config.list_physical_devices("GPU"):
        with contextlib.suppress(RuntimeError, ValueError):
            if fraction and total:
                limit = int(fraction * float(total) / 2**20)
                tf.config.set_logical_device_configuration(
                    gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit)]
                )
                applied["tf_memory_limit_mb"] = limit
            else:
                tf.config.experimental.set_memory_growth(gpu, True)
