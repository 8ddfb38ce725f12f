"""What every PyTorch trainable shares: config, seeding, optimizer, schedule, precision, stopping.

The config keys here are the same names the TensorFlow trainables read, so one search space
can drive either framework. Every key is optional; :func:`read_config` fills the defaults,
checks the choices, and rejects unknown keys (a misspelled knob would otherwise be searched
for nothing).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from search import ConfigError, TrialContext
from trainables.knobs import (  # noqa: F401  (re-exported for the torch trainables)
    AUGMENT_DEFAULTS,
    CHOICES,
    COMMON_DEFAULTS,
    CYCLE_EPOCHS,
    PLATEAU_PATIENCE,
    read_config,
)


def set_seed(seed: int) -> None:
    """Seeds Python's, NumPy's and PyTorch's (CPU and CUDA) random generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def setup(
    config: Mapping[str, Any],
    defaults: Mapping[str, Any],
    ctx: TrialContext,
    choices: Mapping[str, tuple[str, ...]] | None = None,
) -> tuple[dict[str, Any], torch.device]:
    """A trainable's first lines: read the config, check precision, seed, device (the
    framework set the threads and the GPU memory cap before, :mod:`search.compute.limits`).

    The twin of ``trainables.tf.common.setup``: the same arguments, and the same kind of
    return value, ``(cfg, device)``: the filled config and where the model trains.

    Returns:
        The filled config and the ``torch.device`` to train on (the trial's GPU or the CPU).
    """
    cfg = read_config(config, defaults, choices)
    device = torch.device("cuda" if ctx.device.startswith("cuda") else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():  # a logical GPU of Ray's
        print("the trial holds a GPU of Ray's, but PyTorch sees no CUDA device: training on the "
              "CPU", file=sys.stderr)  # fmt: skip
        device = torch.device("cpu")
    check_precision(cfg["precision"], device)
    if device.type == "cuda":
        device = place_on_gpu(ctx)
    set_seed(ctx.seed)
    return cfg, device


def place_on_gpu(ctx: TrialContext) -> torch.device:
    """The trial's GPU: the rank-th of Ray's GPUs in a data-parallel trial (the framework
    capped its memory when trials share it)."""
    device = torch.device("cuda", ctx.rank)
    torch.cuda.set_device(device)
    return device


def build_optimizer(
    params: Iterable[torch.nn.Parameter], cfg: Mapping[str, Any]
) -> torch.optim.Optimizer:
    """SGD (with ``momentum``), Adam (coupled L2) or AdamW (decoupled weight decay)."""
    params = list(params)
    lr, wd = cfg["lr"], cfg["weight_decay"]
    if cfg["optimizer"] == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg["momentum"], weight_decay=wd)
    if cfg["optimizer"] == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    return torch.optim.AdamW(params, lr=lr, weight_decay=wd)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: Mapping[str, Any], max_epochs: int, steps_per_epoch: int
) -> tuple[Any, str]:
    """The learning-rate schedule and when to step it.

    ``step`` decays by ``gamma`` every ``step_size`` epochs, ``cosine`` anneals to 0 over
    ``max_epochs``, ``plateau`` multiplies by ``gamma`` after :data:`PLATEAU_PATIENCE` epochs
    without val_loss improvement, ``cyclic`` is triangular between lr/10 and lr, ``onecycle``
    warms up to lr and anneals over the whole run. Neither cycles momentum, so ``momentum``
    stays what the config says.

    Returns:
        ``(scheduler, when)`` where ``when`` is ``"none"``, ``"epoch"``, ``"val_loss"`` or
        ``"batch"``.
    """
    name, lr, sched = cfg["lr_scheduler"], cfg["lr"], torch.optim.lr_scheduler
    if name == "step":
        step_size = cfg["step_size"] or max(1, max_epochs // 3)
        return sched.StepLR(optimizer, step_size=int(step_size), gamma=cfg["gamma"]), "epoch"
    if name == "cosine":
        return sched.CosineAnnealingLR(optimizer, T_max=max_epochs), "epoch"
    if name == "plateau":
        plateau = sched.ReduceLROnPlateau(optimizer, factor=cfg["gamma"], patience=PLATEAU_PATIENCE)
        return plateau, "val_loss"
    if name == "cyclic":
        up = max(1, CYCLE_EPOCHS * steps_per_epoch)
        cyclic = sched.CyclicLR(
            optimizer, base_lr=lr / 10, max_lr=lr, step_size_up=up, cycle_momentum=False
        )
        return cyclic, "batch"
    if name == "onecycle":
        total = max(1, max_epochs * steps_per_epoch)
        onecycle = sched.OneCycleLR(optimizer, max_lr=lr, total_steps=total, cycle_momentum=False)
        return onecycle, "batch"
    return None, "none"


def l1_penalty(params: Iterable[torch.nn.Parameter]) -> torch.Tensor | float:
    """Sum of absolute values of the weight matrices and kernels (parameters with ndim > 1)."""
    terms = [p.abs().sum() for p in params if p.requires_grad and p.ndim > 1]
    return torch.stack(terms).sum() if terms else 0.0


def grad_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Total L2 norm of the parameters' gradients (0 when there are none)."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())


def clip_gradients(
    params: list[torch.nn.Parameter], clip_norm: float, clip_value: float
) -> torch.Tensor:
    """Clips gradients by value, then by total norm, and returns the norm before clipping.

    Args:
        params: Parameters whose ``.grad`` to clip (already unscaled under fp16).
        clip_norm: Largest total L2 norm (``clip_grad_norm_``); 0 = off.
        clip_value: Largest absolute value of any element (``clip_grad_value_``); 0 = off.

    Returns:
        The total gradient norm before any clipping (NaN/inf when the gradients are).
    """
    norm = grad_norm(params)
    if clip_value > 0:
        torch.nn.utils.clip_grad_value_(params, clip_value)
    if clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, clip_norm)
    return norm


def check_precision(precision: str, device: torch.device) -> None:
    """Raises the one-line error for fp16 on CPU (no GradScaler, no fp16 kernels there)."""
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("precision fp16 needs a CUDA device; use bf16 or fp32 on CPU")


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Mixed precision for the forward pass: bf16 or fp16 autocast, or nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A loss scaler that is active for fp16 only (a pass-through otherwise)."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def memory_format(cfg: Mapping[str, Any], device: torch.device) -> torch.memory_format:
    """The layout of the model's weights and the images: the knob ``memory_format``, where
    ``auto`` is channels_last: the convolutions' fast layout on a GPU's tensor cores, and the
    faster one measured on a CPU's oneDNN too (``benchmarks/RESULTS.md``, ``resnet_cpu.py``).

    Example:
        >>> memory_format({"memory_format": "auto"}, torch.device("cpu")) == torch.channels_last
        True
    """
    chosen = cfg.get("memory_format", "auto")
    if chosen == "auto":
        chosen = "channels_last"
    return torch.channels_last if chosen == "channels_last" else torch.contiguous_format


COMPILE_CACHE_ENTRIES = 64
"""Graphs Dynamo keeps per function: one per model shape a reused worker trains (its default
of 8 would fall back to eager after the eighth shape of a study)."""


def compile_cache_dir() -> str:
    """Where Inductor keeps compiled kernels and graphs across processes: the user's
    ``TORCHINDUCTOR_CACHE_DIR``, else ``search/torchinductor`` under ``XDG_CACHE_HOME``
    (``~/.cache``), so the trials of a study, and the next study, compile a shape once."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        base, "search", "torchinductor"
    )


def compiled(model: torch.nn.Module) -> torch.nn.Module:
    """``torch.compile(model)`` with the on-disk caches on (:func:`compile_cache_dir`).

    Dynamo keys its graphs by the code and the tensors' shapes, not by the module object, so
    a fresh model of the same shape in the same process (the next trial of a reused worker)
    runs the graph already compiled; Inductor's FX-graph and AOTAutograd caches on disk serve
    other processes.
    """
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", compile_cache_dir())
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    import torch._dynamo

    config = torch._dynamo.config
    config.cache_size_limit = max(config.cache_size_limit, COMPILE_CACHE_ENTRIES)
    return torch.compile(model)  # type: ignore[return-value]


class EarlyStopping:
    """Stops when val_loss has not improved by ``min_delta`` for ``patience`` epochs.

    Example:
        >>> stop = EarlyStopping(patience=1)
        >>> stop.update(1.0), stop.update(1.0)
        (False, True)
    """

    def __init__(self, patience: int, min_delta: float = 0.0) -> None:
        self.patience, self.min_delta = patience, min_delta
        self.best, self.bad_epochs = math.inf, 0

    def update(self, val_loss: float) -> bool:
        """Records one epoch's val_loss; True when training should stop."""
        if self.patience <= 0:
            return False
        if val_loss < self.best - self.min_delta:  # False for NaN: never an improvement
            self.best, self.bad_epochs = val_loss, 0
        else:
            self.bad_epochs += 1
        return self.bad_epochs >= self.patience


class EpochProfiler:
    """torch.profiler over the first ``epochs`` epochs of the trial, when ``ctx.profile``.

    The spec's ``profile`` and ``profile_trial`` choose the trial; it writes
    ``profile-trial<N>.json`` (a Chrome trace,
    open it in https://ui.perfetto.dev) into ``ctx.trial_dir``.
    """

    def __init__(self, ctx: TrialContext, device: torch.device, epochs: int = 2) -> None:
        wanted = ctx.profile
        self.path = Path(ctx.trial_dir) / f"profile-trial{ctx.trial_number}.json"
        self.epochs, self._prof = epochs, None
        if wanted:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(activities=activities, record_shapes=True)
            self._prof.start()

    def after_epoch(self, epoch: int) -> None:
        """Stops and writes the trace once ``epoch`` reaches the profiled count."""
        if epoch >= self.epochs:
            self.close()

    def close(self) -> None:
        """Stops and writes the trace if the profiler still runs (early stop, ASHA, error)."""
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.path))
