"""A user's Lightning ``trainer.fit`` as a trainable: one ``fit`` call, one yield per epoch.

A trainable builds its own, unchanged ``LightningModule`` (and loaders or a
``LightningDataModule``) and hands the rest to :func:`fit`::

    import search.lightning
    from search import trainable

    @trainable(defaults={"lr": 1e-2, "precision": "fp32"})
    def train(config, data, ctx):
        module = MyModule(lr=config["lr"])
        return (yield from search.lightning.fit(
            module, ctx, train_dataloaders=train_loader, val_dataloaders=val_loader,
            trainer_kwargs={"precision": config["precision"]},
        ))                                  # returns the module, for the export hook

**Why a thread.** As in :mod:`search.keras`: ``trainer.fit`` runs once, in a background
thread, and a last callback's ``on_train_epoch_end`` (in Lightning 2, after the epoch's
validation) hands ``trainer.callback_metrics`` (as floats) to the generator and waits until
the generator is asked for the next epoch. Closing the generator (ASHA's prune, the epoch
budget) sets ``trainer.should_stop``, releases the callback and joins the thread; an
exception in ``fit`` is raised in the caller.

**Several devices (DDP).** A trainable declared ``@trainable(data_parallel=True)`` in a trial
of several devices (``gpus_per_trial: 2``, or ``workers_per_trial: 2`` on CPU) runs in one
process per device, which :mod:`search.compute.distributed` starts and joins into a
``torch.distributed`` group before the trainable runs (NCCL on GPUs, gloo on CPU). Each
process calls :func:`fit`, which then gives the trainer ``DDPStrategy`` over
``ctx.world_size`` devices with a cluster environment that reads the ranks from the context
and says the processes exist already, so Lightning starts none of its own (its ``ddp`` and
``ddp_spawn`` launchers would start them again inside the Ray actor) and uses the group as
it is, the way Ray Train's ``RayDDPStrategy`` and ``RayLightningEnvironment`` do. Lightning
shards the loaders (``DistributedSampler``) and syncs what the module logs with
``sync_dist=True``; only rank 0's metrics reach the study, and stopping the trial stops every
rank (the processes are ended together).

**Checkpoints.** With ``ctx.checkpoint_dir`` every epoch end writes, before its metrics are
handed out, ``last.ckpt`` (``trainer.save_checkpoint``: weights, optimizer, loops and
callbacks); with ``ctx.restore_dir`` the fit resumes from its ``last.ckpt``
(``ckpt_path=``), at the epoch after the saved one. In a DDP trial only rank 0 has the
folder, but every rank calls ``save_checkpoint`` (it ends on a barrier); rank 0 writes.
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

from search.contract import Metrics, TrialContext, as_metrics
from search.contract.handoff import Handoff, drive

CHECKPOINT_FILE = "last.ckpt"
PRECISIONS = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
"""The built-ins' ``precision`` knob values and Lightning's names for them."""
_MISSING = "search.lightning needs Lightning: pip install -e '.[lightning]'"
_RANK_ZERO_LOG = "lightning.pytorch.utilities.rank_zero"
"""The logger of Lightning's ``rank_zero_info`` lines (GPU available, a litlogger tip, ...)."""


def fit(
    module: Any,
    ctx: TrialContext,
    *,
    datamodule: Any = None,
    train_dataloaders: Any = None,
    val_dataloaders: Any = None,
    trainer_kwargs: Mapping[str, Any] | None = None,
) -> Generator[Metrics, None, Any]:
    """Runs ``trainer.fit(module, ...)`` once over the trial's epochs, yielding each.

    The trainer gets ``max_epochs=ctx.max_epochs``, ``logger=False``, no progress bar and no
    model summary, the CPU unless ``ctx.device`` is ``"cuda"``, ``ctx.world_size`` devices
    (with ``DDPStrategy`` over the trial's processes when there are several), then
    ``trainer_kwargs`` (whose ``precision`` may be a knob value, ``"fp32"``, ``"bf16"`` or
    ``"fp16"``). After the last epoch the generator returns ``module``.

    Yields:
        Each epoch's ``trainer.callback_metrics`` (``val_loss``, ...), as Python floats.

    Raises:
        ImportError: When Lightning is not installed (on the call, not the first epoch).
        TypeError: When ``trainer_kwargs`` sets ``max_epochs`` (the context sets it), or
            ``strategy`` or ``devices`` in a trial of several processes.
        Exception: Whatever ``trainer.fit`` raised, in the caller.
    """
    if importlib.util.find_spec("lightning") is None:
        raise ImportError(_MISSING)
    kwargs = dict(trainer_kwargs or {})
    if "max_epochs" in kwargs:
        raise TypeError("search.lightning.fit sets max_epochs from the trial's context")
    taken = sorted({"strategy", "devices"} & kwargs.keys())
    if ctx.world_size > 1 and taken:
        raise TypeError(
            f"search.lightning.fit sets {' and '.join(taken)} in a trial of "
            f"{ctx.world_size} processes (DDP over the trial's devices)"
        )
    loaders = {
        "datamodule": datamodule,
        "train_dataloaders": train_dataloaders,
        "val_dataloaders": val_dataloaders,
    }
    return _fit(module, ctx, kwargs, {k: v for k, v in loaders.items() if v is not None})


def trainer_options(ctx: TrialContext, trainer_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The ``lightning.Trainer`` keywords :func:`fit` uses for ``ctx``."""
    options: dict[str, Any] = {
        "max_epochs": ctx.max_epochs,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "accelerator": "gpu" if ctx.device == "cuda" else "cpu",
        "devices": ctx.world_size,
        **trainer_kwargs,
    }
    precision = options.get("precision")
    options["precision"] = PRECISIONS.get(str(precision), precision or "32-true")
    return options


def _fit(
    module: Any, ctx: TrialContext, kwargs: dict[str, Any], loaders: dict[str, Any]
) -> Generator[Metrics, None, Any]:
    import lightning

    _quiet_lightning()
    handoff = _Handoff(ctx)
    options = trainer_options(ctx, kwargs)
    if ctx.world_size > 1:
        options["strategy"] = _ddp_strategy(ctx)
    options["callbacks"] = [*options.get("callbacks", []), handoff.callback()]
    trainer = lightning.Trainer(**options)
    handoff.trainer = trainer
    if ctx.restore_dir:
        loaders["ckpt_path"] = str(Path(ctx.restore_dir) / CHECKPOINT_FILE)
    name = f"lightning-fit-{ctx.trial_number}"
    yield from drive(handoff, lambda: trainer.fit(module, **loaders), name, handoff.stop)
    return module


def _quiet_lightning() -> None:
    """Keeps the lines Lightning prints on its own, not for the user's code, off the console.

    Its ``rank_zero_info`` lines (``GPU available: False``, a litlogger tip, ``Trainer.fit
    stopped``) go to warnings and above, unless the user set that logger's level, and the
    FutureWarning torch raises on Lightning's own ``LeafSpec()`` is ignored. What the user's
    module or the trainer warns of for their code is left alone.
    """
    log = logging.getLogger(_RANK_ZERO_LOG)
    if log.level == logging.NOTSET:
        log.setLevel(logging.WARNING)
    leaf_spec = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
    warnings.filterwarnings("ignore", message=leaf_spec, category=FutureWarning)


def _ddp_strategy(ctx: TrialContext) -> Any:
    """``DDPStrategy`` over the process group this trial's processes already joined.

    Raises:
        RuntimeError: When no group is there (``ctx.world_size`` set by hand, not by
            :mod:`search.compute.distributed`).
    """
    import torch.distributed as dist
    from lightning.pytorch.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies import DDPStrategy

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"search.lightning.fit: ctx.world_size is {ctx.world_size} but this process is in "
            "no torch.distributed group (search.compute.distributed starts and joins them)"
        )

    class _TrialProcesses(LightningEnvironment):
        """The trial's ranks, from its context; the processes exist already."""

        @property
        def creates_processes_externally(self) -> bool:
            return True

        def world_size(self) -> int:
            return ctx.world_size

        def global_rank(self) -> int:
            return ctx.rank

        def local_rank(self) -> int:
            return ctx.rank  # one node: rank r trains on the r-th of the trial's devices

        def node_rank(self) -> int:
            return 0

        def set_world_size(self, size: int) -> None:
            pass  # the context's, not what Lightning counts

        def set_global_rank(self, rank: int) -> None:
            pass

    backend = "nccl" if ctx.device == "cuda" else "gloo"
    return DDPStrategy(cluster_environment=_TrialProcesses(), process_group_backend=backend)


class _Handoff(Handoff):
    """The fit thread's callback, saving ``last.ckpt`` before handing each epoch out."""

    def __init__(self, ctx: TrialContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.trainer: Any = None

    def callback(self) -> Any:
        """A ``lightning.Callback`` whose ``on_train_epoch_end`` is :meth:`_epoch_end`."""
        from lightning import Callback

        handoff = self

        class _EpochHandoff(Callback):
            def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
                handoff.epoch_end(trainer)

        return _EpochHandoff()

    def stop(self) -> None:
        """Stops ``fit`` at the next check."""
        if self.trainer is not None:
            self.trainer.should_stop = True

    def epoch_end(self, trainer: Any) -> None:
        """Saves ``last.ckpt``, hands the metrics out, waits to be asked for the next."""
        raw = as_metrics(dict(trainer.callback_metrics))
        metrics = {k: v for k, v in raw.items() if isinstance(v, float)}
        folder = self.ctx.checkpoint_dir
        saves = folder is not None
        if self.ctx.world_size > 1:  # rank 0 has the folder; every rank must save (a barrier)
            saves = bool(trainer.strategy.broadcast(saves, src=0))
        if saves:
            if folder is not None:
                Path(folder).mkdir(parents=True, exist_ok=True)
            path = Path(folder or ".") / CHECKPOINT_FILE
            trainer.save_checkpoint(path, weights_only=False)  # rank 0 writes; the whole state
        if not self.hand(metrics):
            trainer.should_stop = True
