"""What the framework applies in a training process before the trainable runs: its threads, the
GPUs TensorFlow sees and, on a shared GPU, its memory cap. A user's trainable gets all of it
without code of its own, and so do the built-ins: this module is the only place that sets them.

Every executor calls :func:`prepare` (the trainable's module imported first, then the limits):
a Ray trial (:mod:`search.tuning.worker`), each process of a data-parallel trial
(:mod:`search.compute.distributed`), a confirmation run, the final model and ``train``
(:mod:`search.handover.train`), and the GPU memory probe (:mod:`search.compute.gpu_memory`).

* Threads: ``OMP_NUM_THREADS`` (and ``MKL_NUM_THREADS``) for libraries that start later; and
  ``torch.set_num_threads`` or TensorFlow's thread pools when the trainable's module already
  imported that framework (importing one here would cost seconds a trial that needs none).
* GPU memory of a packed trial (``ctx.gpu_memory_fraction``): PyTorch reads the cap from
  ``PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:F`` when it first touches CUDA, so it
  holds whenever the trainable imports torch; when the trainable's module imported it,
  ``torch.cuda.set_per_process_memory_fraction`` sets it at once. TensorFlow gets a logical
  device of ``F`` times the GPU's memory (``ctx.gpu_total_bytes`` when ``auto`` measured it,
  else what ``nvidia-smi`` says of the first visible GPU); whole GPUs get memory growth.
* TensorFlow's devices: a CPU trial sees no GPU, and an ``in_process`` data-parallel trial on
  CPUs gets ``ctx.replicas`` logical CPU devices to mirror its model over.
* A trainable that imports TensorFlow (or Keras) inside its function, not at its module's
  top, gets the same: the settings are applied the moment ``import tensorflow`` completes
  (a finder on ``sys.meta_path`` until then), before any op can start TF's runtime; Keras
  gets its seed the moment ``import keras`` completes (TensorFlow's import runs inside
  Keras's, so nothing here touches Keras before then: :mod:`search.compute.seeds`).

TensorFlow accepts its settings only before its runtime starts (a reused trial process asks
again for the same ones, which it allows); a setting it refuses is left out of the record and
noted as ``tf_kept``.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from search.compute.seeds import loaded, seed_everything, seed_keras, seed_tensorflow
from search.contract import TrialContext, declarations

if TYPE_CHECKING:
    from search.contract.registry import Declarations

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
FRACTION_KEY = "per_process_memory_fraction"
_log = logging.getLogger(__name__)

TF_KEPT = "TensorFlow had started: its own settings hold"
"""``limits["tf_kept"]`` when TensorFlow refused a setting."""


def _with_fraction(conf: str, fraction: float) -> str:
    """``conf`` (comma-separated ``key:value``) with the memory fraction set to ``fraction``.

    Example:
        >>> _with_fraction("expandable_segments:True", 0.45)
        'expandable_segments:True,per_process_memory_fraction:0.45'
    """
    parts = [p for p in conf.split(",") if p and not p.startswith(f"{FRACTION_KEY}:")]
    return ",".join([*parts, f"{FRACTION_KEY}:{fraction:g}"])


def prepare(trainable: str, ctx: TrialContext) -> tuple[Declarations, dict[str, Any]]:
    """Imports ``trainable``'s module (and the framework it uses), then applies ``ctx``'s limits
    to this process: what every executor does before it trains.

    Returns:
        The trainable's declarations, and what :func:`apply_limits` applied.
    """
    declared = declarations(trainable)
    return declared, apply_limits(ctx)


def apply_limits(ctx: TrialContext) -> dict[str, Any]:
    """Applies ``ctx``'s threads, devices and GPU memory cap to this process, and seeds its
    generators with ``ctx.seed`` (:mod:`search.compute.seeds`); returns what it applied
    (recorded on the trial as the user attribute ``limits``)."""
    applied: dict[str, Any] = {"threads": ctx.num_threads}
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(ctx.num_threads)
    fraction = ctx.gpu_memory_fraction if ctx.device == "cuda" else None
    if fraction:
        os.environ[ALLOC_CONF] = _with_fraction(os.environ.get(ALLOC_CONF, ""), fraction)
        applied["gpu_memory_fraction"] = fraction
    if loaded("torch") is not None:
        _torch(ctx, fraction)
    disarm()
    seed_everything(ctx.seed)
    if loaded("tensorflow") is not None:
        _tensorflow(ctx, fraction, applied)
    elif "tensorflow" not in sys.modules:  # a trainable that imports TF (or Keras) itself
        arm("tensorflow", lambda tf: _late_tf(tf, ctx, fraction, applied))
    if "keras" not in sys.modules:
        arm("keras", lambda keras: seed_keras(ctx.seed, keras))
    return applied


def _late_tf(
    tf: ModuleType, ctx: TrialContext, fraction: float | None, applied: dict[str, Any]
) -> None:
    """TensorFlow imported by the trainable itself: its limits, then its seed. Keras may be
    half imported here (``import keras`` imports TensorFlow): neither touches Keras nor
    ``tf.keras`` (:mod:`search.compute.seeds`)."""
    _tensorflow(ctx, fraction, applied)
    seed_tensorflow(ctx.seed, tf)


def arm(name: str, then: Callable[[ModuleType], None]) -> None:
    """Calls ``then`` with the module ``name`` the moment a later import of it completes,
    before its importer goes on (so before any TensorFlow op could start TF's runtime); an
    error in ``then`` is logged, and the import goes on."""
    sys.meta_path.insert(0, _AfterImport(name, then))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then`` once the module ``name`` has been imported, before its importer goes on
    (so before any TensorFlow op could start TF's runtime); then leaves ``sys.meta_path``."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then, self._finding = name, then, False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self._finding:
            return None
        self._finding = True  # the other finders find it; this one only wraps its loader
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is not None and isinstance(spec.loader, importlib.abc.Loader):
            spec.loader = _ThenLoader(spec.loader, self)
        return spec


class _ThenLoader(importlib.abc.Loader):
    """``loader``, with the hook's ``then`` after the module ran."""

    def __init__(self, loader: importlib.abc.Loader, hook: _AfterImport) -> None:
        self.loader, self.hook = loader, hook

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self.hook]
        try:
            self.hook.then(module)
        except Exception as exc:  # the user's import must not fail for want of a setting
            _log.warning("could not apply the trial's limits to %s: %s", self.hook.name, exc)


def disarm() -> None:
    """Drops the settings waiting for a later ``import tensorflow`` or ``import keras`` (an
    earlier trial's): a run in a process that goes on after it (``train``, the final model)
    calls it at its end."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterImport)]


def _torch(ctx: TrialContext, fraction: float | None) -> None:
    """PyTorch's threads and, on a shared GPU, its allocator's cap: set at once where CUDA is
    up, or where PyTorch is the only framework (a TensorFlow trial that imported torch gets
    the environment variable only, so that no CUDA context of PyTorch's takes its memory)."""
    import torch

    torch.set_num_threads(max(1, ctx.num_threads))
    if not fraction or not torch.cuda.is_available():
        return
    if torch.cuda.is_initialized() or "tensorflow" not in sys.modules:
        torch.cuda.set_per_process_memory_fraction(fraction)


def visible_gpu_bytes() -> int | None:
    """The memory of this process's first visible GPU (``CUDA_VISIBLE_DEVICES``, as Ray sets
    it), read from ``nvidia-smi``; None when no GPU is visible or ``nvidia-smi`` cannot say."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    if not first:
        return None
    query = [
        "nvidia-smi",
        f"--id={first}",
        "--query-gpu=memory.total",
        "--format=csv,noheader,nounits",
    ]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True)
        mib = float(done.stdout.split()[0])  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return int(mib * 2**20)


def _tf_call(applied: dict[str, Any], setting: Callable[..., Any], *args: Any) -> bool:
    """Calls one TensorFlow ``setting``; False (and ``tf_kept`` noted) when TF refused it."""
    try:
        setting(*args)
    except (RuntimeError, ValueError):
        applied["tf_kept"] = TF_KEPT
        return False
    return True


def _tensorflow(ctx: TrialContext, fraction: float | None, applied: dict[str, Any]) -> None:
    """TensorFlow's thread pools, visible devices and GPU memory."""
    import tensorflow as tf

    threads = max(1, ctx.num_threads)
    _tf_call(applied, tf.config.threading.set_intra_op_parallelism_threads, threads)
    _tf_call(applied, tf.config.threading.set_inter_op_parallelism_threads, threads)
    gpus = tf.config.list_physical_devices("GPU")
    if ctx.device == "cuda" and gpus:
        _tf_gpus(ctx, fraction, gpus, applied)
        return
    if gpus:
        _tf_call(applied, tf.config.set_visible_devices, [], "GPU")
    if ctx.replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        devices = [tf.config.LogicalDeviceConfiguration() for _ in range(ctx.replicas)]
        if _tf_call(applied, tf.config.set_logical_device_configuration, cpu, devices):
            applied["tf_cpu_devices"] = ctx.replicas


def _tf_gpus(
    ctx: TrialContext, fraction: float | None, gpus: list[Any], applied: dict[str, Any]
) -> None:
    """A logical device of ``fraction`` of the GPU's memory on each GPU, or memory growth."""
    import tensorflow as tf

    total = (ctx.gpu_total_bytes or visible_gpu_bytes()) if fraction else None
    for gpu in gpus:
        if fraction and total:
            limit = int(fraction * float(total) / 2**20)
            capped = [tf.config.LogicalDeviceConfiguration(memory_limit=limit)]
            if _tf_call(applied, tf.config.set_logical_device_configuration, gpu, capped):
                applied["tf_memory_limit_mb"] = limit
        else:
            _tf_call(applied, tf.config.experimental.set_memory_growth, gpu, True)
