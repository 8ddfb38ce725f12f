"""The epoch loop every PyTorch trainable shares: train, validate, schedule, report, stop.

A trainable builds its model and then ``yield from fit_epochs(model, tensors, cfg, ctx, device)``.
Each epoch yields::

    train_loss, train_accuracy   running means over the epoch's training batches
    val_loss, val_accuracy       on the whole validation split, model in eval mode
    lr                           learning rate the epoch started with
    grad_norm                    largest total gradient norm of the epoch, before clipping
    grad_norm_applied            largest total gradient norm after clipping (what was applied)
    epoch_time_s                 wall time of the epoch (training and validation)
    train_images_per_s           training images per second of the epoch's training part
    data_cached                  1 when the trial found its data already loaded in its process
                                 (:mod:`trainables.torch.device_data`), else 0

The raw losses are reported, so a diverged run shows NaN and the framework stops it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from search import Metrics, TrialContext
from trainables.torch.common import (
    EarlyStopping,
    EpochProfiler,
    autocast,
    build_optimizer,
    build_scheduler,
    clip_gradients,
    compiled,
    grad_norm,
    grad_scaler,
    l1_penalty,
)
from trainables.torch.data import Tensors, train_loader
from trainables.torch.device_data import DeviceBatches, on_device


@dataclass
class Fitting:
    """Everything one training step needs."""

    model: torch.nn.Module
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    when: str  # when the scheduler steps: none | epoch | val_loss | batch
    scaler: torch.amp.GradScaler
    cfg: Mapping[str, Any]
    device: torch.device


def _distributed() -> bool:
    """Whether this process is one of several training one trial (search.compute.distributed)."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _all_reduce(values: list[torch.Tensor | float], op: str = "sum") -> list[float]:
    """Sums (or maxes) scalars over the trial's processes; the values themselves alone."""
    tensor = torch.stack([torch.as_tensor(v, dtype=torch.float64).reshape(()) for v in values]).to(
        _reduce_device()
    )
    if _distributed():
        dist = torch.distributed
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return [float(v) for v in tensor.tolist()]


def _reduce_device() -> torch.device:
    if _distributed() and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def train_one_epoch(
    fit: Fitting, loader: DataLoader | DeviceBatches, max_steps: int | None = None
) -> Metrics:
    """One pass over ``loader`` (at most ``max_steps`` batches); returns train_loss,
    train_accuracy and gradient norms (over every process of a data-parallel trial), and
    the images it trained on (``images``, this process's)."""
    fit.model.train()
    cfg, dev = fit.cfg, fit.device
    smoothing = float(cfg.get("label_smoothing", 0.0))
    zero = torch.zeros((), device=dev)
    loss_sum, correct, norm_max, applied_max, seen = zero, zero, zero, zero, 0
    for step, (xb, yb) in enumerate(loader):
        if max_steps is not None and step >= max_steps:
            break
        xb, yb = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
        with autocast(cfg["precision"], dev):
            logits = fit.model(xb)
            loss = F.cross_entropy(logits.float(), yb, label_smoothing=smoothing)
        total = loss + cfg["l1"] * l1_penalty(fit.params) if cfg["l1"] > 0 else loss
        fit.optimizer.zero_grad(set_to_none=True)
        fit.scaler.scale(total).backward()
        fit.scaler.unscale_(fit.optimizer)
        norm = clip_gradients(fit.params, cfg["clip_norm"], cfg["clip_value"])
        applied = grad_norm(fit.params) if cfg["clip_norm"] or cfg["clip_value"] else norm
        if cfg["precision"] == "fp16":  # inf here is GradScaler probing its scale; step is skipped
            norm, applied = (torch.nan_to_num(t, posinf=0.0) for t in (norm, applied))
        fit.scaler.step(fit.optimizer)
        fit.scaler.update()
        if fit.when == "batch":
            fit.scheduler.step()
        loss_sum = loss_sum + loss.detach() * len(yb)
        correct = correct + (logits.argmax(dim=1) == yb).sum()
        norm_max, applied_max = torch.maximum(norm_max, norm), torch.maximum(applied_max, applied)
        seen += len(yb)
    if _distributed():
        loss_total, correct_total, seen_total = _all_reduce([loss_sum, correct, seen])
        norm_top, applied_top = _all_reduce([norm_max, applied_max], op="max")
        return {
            "train_loss": loss_total / seen_total,
            "train_accuracy": correct_total / seen_total,
            "grad_norm": norm_top,
            "grad_norm_applied": applied_top,
            "images": float(seen),
        }
    return {
        "train_loss": loss_sum.item() / seen,
        "train_accuracy": correct.item() / seen,
        "grad_norm": norm_max.item(),
        "grad_norm_applied": applied_max.item(),
        "images": float(seen),
    }


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    precision: str,
    device: torch.device,
    batch_size: int = 512,
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` (in eval mode) on ``(x, y)``."""
    model.eval()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device)
    for i in range(0, len(y), batch_size):
        xb, yb = x[i : i + batch_size], y[i : i + batch_size]
        with autocast(precision, device):
            logits = model(xb)
        loss_sum += F.cross_entropy(logits.float(), yb, reduction="sum")
        correct += (logits.argmax(dim=1) == yb).sum()
    return loss_sum.item() / len(y), correct.item() / len(y)


def make_fitting(
    model: torch.nn.Module,
    cfg: Mapping[str, Any],
    ctx: TrialContext,
    device: torch.device,
    steps_per_epoch: int,
) -> Fitting:
    """Moves ``model`` to ``device`` and builds optimizer, scheduler and scaler for it."""
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, cfg)
    scheduler, when = build_scheduler(optimizer, cfg, ctx.max_epochs, steps_per_epoch)
    return Fitting(
        model,
        params,
        optimizer,
        scheduler,
        when,
        grad_scaler(cfg["precision"], device),
        cfg,
        device,
    )


def evaluate_shard(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    precision: str,
    device: torch.device,
    rank: int,
    world: int,
) -> tuple[float, float]:
    """:func:`evaluate` on every ``world``-th example from ``rank``, combined over the trial's
    processes, so every rank gets the whole validation split's loss and accuracy."""
    if world <= 1:
        return evaluate(model, x, y, precision, device)
    xs, ys = x[rank::world], y[rank::world]
    loss, accuracy = evaluate(model, xs, ys, precision, device) if len(ys) else (0.0, 0.0)
    loss_sum, correct, count = _all_reduce([loss * len(ys), accuracy * len(ys), len(ys)])
    return loss_sum / count, correct / count


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a ``torch.compile`` or ``DistributedDataParallel`` wrapper
    (checkpoints hold it bare)."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule
    ddp = torch.nn.parallel.DistributedDataParallel
    return model.module if isinstance(model, ddp) else model


STATE_FILE = "state.pt"


def save_state(fit: Fitting, stopper: EarlyStopping, epoch: int, folder: str) -> None:
    """Writes everything a retried trial needs to continue after ``epoch`` into ``folder``."""
    state = {
        "epoch": epoch,
        "model": _unwrapped(fit.model).state_dict(),
        "optimizer": fit.optimizer.state_dict(),
        "scheduler": fit.scheduler.state_dict() if fit.scheduler is not None else None,
        "scaler": fit.scaler.state_dict(),
        "stopper": [float(stopper.best), int(stopper.bad_epochs)],
    }
    torch.save(state, Path(folder) / STATE_FILE)


def load_state(fit: Fitting, stopper: EarlyStopping, folder: str) -> int:
    """Restores what :func:`save_state` wrote (tensors only: ``weights_only=True``).

    Returns:
        The epoch the state was saved after.
    """
    state = torch.load(Path(folder) / STATE_FILE, map_location=fit.device, weights_only=True)
    _unwrapped(fit.model).load_state_dict(state["model"])
    fit.optimizer.load_state_dict(state["optimizer"])
    if fit.scheduler is not None and state["scheduler"] is not None:
        fit.scheduler.load_state_dict(state["scheduler"])
    if state["scaler"]:
        fit.scaler.load_state_dict(state["scaler"])
    stopper.best, stopper.bad_epochs = state["stopper"][0], int(state["stopper"][1])
    return int(state["epoch"])


Fitted = tuple[torch.nn.Module, Tensors]
"""What :func:`fit_epochs` returns after its last epoch: the model and its data."""


LATENCY_RUNS = 20
"""Timed forward passes behind ``latency_ms`` (the median; 3 more warm up first)."""


@torch.no_grad()
def model_costs(model: torch.nn.Module, example: torch.Tensor, device: torch.device) -> Metrics:
    """What serving the model costs: ``latency_ms`` (the median forward pass at batch 1 on
    the trial's device), ``params`` and ``model_mb`` (its parameters' bytes, in MiB). The
    twin of :func:`trainables.tf.loop.model_costs`; cost objectives of a multi-objective study.
    """
    was_training = model.training
    model.eval()
    x = example[:1].to(device)
    times = []
    for run in range(LATENCY_RUNS + 3):
        start = time.perf_counter()
        model(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if run >= 3:
            times.append(time.perf_counter() - start)
    model.train(was_training)
    params = list(_unwrapped(model).parameters())
    return {
        "latency_ms": 1000.0 * sorted(times)[len(times) // 2],
        "params": float(sum(p.numel() for p in params)),
        "model_mb": sum(p.numel() * p.element_size() for p in params) / 2**20,
    }


def batches(
    tensors: Tensors, cfg: Mapping[str, Any], ctx: TrialContext, device: torch.device
) -> DataLoader | DeviceBatches:
    """The trial's training batches: drawn from the dataset on ``device``
    (:class:`~trainables.torch.device_data.DeviceBatches`, where
    :func:`~trainables.torch.device_data.on_device` says so), else a host ``DataLoader``
    with ``num_workers`` and ``pin_memory`` (:func:`~trainables.torch.data.train_loader`)."""
    crop, hflip = int(cfg.get("crop", 0)), bool(cfg.get("hflip", False))
    if on_device(cfg, device):
        if tensors.x_train.device != device:  # a trainable that left them on the host
            tensors = dataclasses.replace(
                tensors, x_train=tensors.x_train.to(device), y_train=tensors.y_train.to(device)
            )
        return DeviceBatches(
            tensors,
            cfg["batch_size"],
            ctx.seed,
            crop=crop,
            hflip=hflip,
            rank=ctx.rank,
            world=ctx.world_size,
        )
    return train_loader(
        tensors,
        cfg["batch_size"],
        ctx.seed,
        augment=cfg.get("augment", 0.0),
        hflip=hflip,
        crop=crop,
        num_workers=cfg["num_workers"],
        pin_memory=cfg["pin_memory"] and device.type == "cuda",
        rank=ctx.rank,
        world=ctx.world_size,
    )


def step_scheduler(fit: Fitting, val_loss: float) -> None:
    """Steps an epoch-wise schedule at the end of an epoch (``plateau`` on ``val_loss``)."""
    if fit.when == "epoch":
        fit.scheduler.step()
    elif fit.when == "val_loss":
        fit.scheduler.step(val_loss)


def fit_epochs(
    model: torch.nn.Module,
    tensors: Tensors,
    cfg: Mapping[str, Any],
    ctx: TrialContext,
    device: torch.device,
) -> Generator[Metrics, None, Fitted]:
    """Trains ``model`` for up to ``ctx.max_epochs`` epochs, yielding one metrics dict each.

    Returns early (the trial ends COMPLETE) when early stopping triggers on val_loss. With
    ``ctx.checkpoint_dir`` it saves its state (early stopping's counters updated with the
    epoch's val_loss) before each yield; with ``ctx.restore_dir`` it continues after the
    saved epoch, so a retried trial stops at the epoch the first run would have.

    In a data-parallel trial (``ctx.world_size`` > 1, started by
    :mod:`search.compute.distributed`) the model trains under ``DistributedDataParallel``, each
    rank on its share of every global batch of ``batch_size``, and the metrics are the whole
    trial's. ``ctx.max_steps`` caps the batches per epoch (the memory measurement of
    :mod:`search.compute.placement`).

    Returns:
        ``(model, tensors)`` after the last epoch (:data:`Fitted`), for an export hook.
    """
    rank, world = ctx.rank, ctx.world_size
    loader = batches(tensors, cfg, ctx, device)
    fit = make_fitting(model, cfg, ctx, device, len(loader))
    stopper = EarlyStopping(cfg["early_stopping_patience"], cfg["early_stopping_min_delta"])
    first = 1 if ctx.restore_dir is None else load_state(fit, stopper, ctx.restore_dir) + 1
    if world > 1 and _distributed():  # DDP broadcasts rank 0's weights to every rank here
        fit.model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if cfg.get("compile"):  # the training step; evaluation stays eager (one more graph each)
        fit.model = compiled(fit.model)
    x_val, y_val = tensors.x_val.to(device), tensors.y_val.to(device)
    max_steps = ctx.max_steps
    profiler = EpochProfiler(ctx, device)
    costs: Metrics = {}  # measured once, after the first epoch (they depend on the config only)
    try:
        for epoch in range(first, ctx.max_epochs + 1):
            start, lr = time.perf_counter(), fit.optimizer.param_groups[0]["lr"]
            sampler = loader if isinstance(loader, DeviceBatches) else loader.sampler
            if hasattr(sampler, "set_epoch"):  # the same shuffle on every rank, and on a retry
                sampler.set_epoch(epoch)
            metrics = train_one_epoch(fit, loader, max_steps)
            images_per_s = metrics.pop("images") / max(time.perf_counter() - start, 1e-9)
            val_loss, val_accuracy = evaluate_shard(
                model, x_val, y_val, cfg["precision"], device, rank, world
            )
            step_scheduler(fit, val_loss)
            profiler.after_epoch(epoch)
            stop = stopper.update(val_loss)  # before the checkpoint: it holds this epoch too
            if ctx.checkpoint_dir is not None:
                save_state(fit, stopper, epoch, ctx.checkpoint_dir)
            costs = costs or model_costs(model, x_val, device)
            yield {
                **metrics,
                **costs,
                "val_loss": val_loss,
                "val_accuracy": val_accuracy,
                "lr": lr,
                "epoch_time_s": time.perf_counter() - start,
                "train_images_per_s": images_per_s,
                "data_cached": float(tensors.cached),
            }
            if stop:
                break
    finally:
        profiler.close()
    return model, tensors
