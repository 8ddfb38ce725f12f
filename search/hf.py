"""A user's Hugging Face ``Trainer`` as a trainable: one ``trainer.train()``, one yield per epoch.

A trainable builds its own model and datasets and hands the rest to :func:`train`::

    import search.hf
    from search import trainable

    @trainable(defaults={"lr": 5e-4, "batch_size": 16})
    def train(config, data, ctx):
        from transformers import Trainer
        args = search.hf.training_args(config, ctx)   # lr, batch size, epochs, folders
        trainer = Trainer(model=build(config), args=args,
                          train_dataset=..., eval_dataset=..., compute_metrics=...)
        return (yield from search.hf.train(trainer, ctx))  # returns the model

**Why a thread.** As in :mod:`search.keras`: ``trainer.train()`` runs once, in a background
thread, and a :class:`~transformers.TrainerCallback` hands each epoch's evaluation to the
generator, then waits until the generator is asked for the next epoch. Closing the generator
(ASHA's prune, the epoch budget) sets ``control.should_training_stop`` and joins the thread;
an exception in ``train()`` is raised in the caller.

**Checkpoints.** With ``ctx.checkpoint_dir`` the Trainer saves ``checkpoint-N`` there each
epoch (model, optimizer, scheduler, RNG states; only the latest kept) *before* its metrics
are handed out; with ``ctx.restore_dir`` :func:`train` resumes from the last one there.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Generator, Mapping
from typing import Any

from search.contract import Metrics, TrialContext, as_metrics
from search.contract.handoff import Handoff, drive

MISSING = "search.hf needs transformers: pip install -e '.[hf]'"
SCHEDULERS = {"none": "constant", "cosine": "cosine", "plateau": "reduce_lr_on_plateau"}
"""The built-in ``lr_scheduler`` knob's values as Hugging Face names them (others pass as
they are, so any ``SchedulerType`` works; Hugging Face rejects unknown ones)."""
TIMINGS = ("_runtime", "_per_second")
"""Evaluation timings the Trainer adds (``eval_runtime``, ...): left out of the metrics, which
then depend on the model alone."""


def _require() -> None:
    """Raises one line when ``transformers`` is not installed."""
    if importlib.util.find_spec("transformers") is None:
        raise ModuleNotFoundError(MISSING)


def training_args(config: Mapping[str, Any], ctx: TrialContext, **overrides: Any) -> Any:
    """``TrainingArguments`` filled from the trial's knobs and context.

    Knobs read (when present): ``lr`` or ``learning_rate``, ``batch_size`` (train and eval),
    ``weight_decay``, ``lr_scheduler`` (``lr_scheduler_type``; ``none`` -> ``constant``)
    and ``precision`` (``bf16``/``fp16``). The context gives ``num_train_epochs``
    (``max_epochs``), ``seed``, ``output_dir`` (``checkpoint_dir``, else a temporary folder)
    and ``use_cpu`` (unless ``device`` is ``cuda``). Evaluation runs each epoch; saving too
    when there is a ``checkpoint_dir`` (``save_total_limit=1``). ``overrides`` win.

    Raises:
        ModuleNotFoundError: When ``transformers`` is not installed.
    """
    _require()
    from transformers import TrainingArguments

    kwargs: dict[str, Any] = {
        "output_dir": ctx.checkpoint_dir or tempfile.mkdtemp(prefix="search-hf-"),
        "num_train_epochs": ctx.max_epochs,
        "seed": ctx.seed,
        "eval_strategy": "epoch",
        "save_strategy": "epoch" if ctx.checkpoint_dir else "no",
        "logging_strategy": "epoch",
        "save_total_limit": 1,
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": ctx.device != "cuda",
        "dataloader_pin_memory": ctx.device == "cuda",
    }
    kwargs.update(_knobs(config))
    kwargs.update(overrides)
    return TrainingArguments(**kwargs)


def _knobs(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``TrainingArguments`` fields the trial's knobs set."""
    found: dict[str, Any] = {}
    lr = config.get("learning_rate", config.get("lr"))
    if lr is not None:
        found["learning_rate"] = float(lr)
    if "batch_size" in config:
        size = int(config["batch_size"])
        found |= {"per_device_train_batch_size": size, "per_device_eval_batch_size": size}
    if "weight_decay" in config:
        found["weight_decay"] = float(config["weight_decay"])
    if "lr_scheduler" in config:
        name = str(config["lr_scheduler"])
        found["lr_scheduler_type"] = SCHEDULERS.get(name, name)
    precision = config.get("precision", "fp32")
    if precision in ("bf16", "fp16"):
        found[precision] = True
    return found


def train(trainer: Any, ctx: TrialContext) -> Generator[Metrics, None, Any]:
    """Runs ``trainer.train()`` once over the trial's epochs, yielding each evaluation.

    Resumes from the last ``checkpoint-N`` in ``ctx.restore_dir`` when there is one. The
    Trainer's ``PrinterCallback`` (its log dicts printed when tqdm is off) is removed: each
    epoch reaches the study and the run's own lines instead. After
    the last epoch it returns ``trainer.model``, so ``return (yield from train(...))`` hands
    the trained model to :func:`~search.train_to_end`.

    Yields:
        Each epoch's evaluation metrics as the Trainer names them (``eval_loss``, and
        ``eval_<name>`` for each of ``compute_metrics``'), plus ``epoch``; all floats.
        The timings (:data:`TIMINGS`) are left out.

    Raises:
        ModuleNotFoundError: When ``transformers`` is not installed.
        Exception: Whatever ``trainer.train()`` raised, in the caller.
    """
    _require()
    from transformers import PrinterCallback
    from transformers.trainer_utils import get_last_checkpoint

    trainer.remove_callback(PrinterCallback)
    handoff = _Handoff()
    trainer.add_callback(handoff.callback(saves=trainer.args.save_strategy != "no"))
    restore = ctx.restore_dir
    resume = get_last_checkpoint(restore) if restore and os.path.isdir(restore) else None
    name = f"hf-train-{ctx.trial_number}"

    def train_once() -> None:
        trainer.train(resume_from_checkpoint=resume or None)

    yield from drive(handoff, train_once, name, handoff.stop)
    return trainer.model


class _Handoff(Handoff):
    """The train thread's callback, handing out each evaluation after its save."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped = False

    def callback(self, saves: bool) -> Any:
        """A ``TrainerCallback`` handing off after each evaluation (after its save, if any)."""
        from transformers import TrainerCallback

        handoff = self
        pending: Metrics = {}

        class Handoff(TrainerCallback):  # type: ignore[misc]
            def on_evaluate(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
                pending.clear()
                pending.update(_floats(kw.get("metrics") or {}, state.epoch))
                return control if saves else handoff.hand_over(control, pending)

            def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
                return handoff.hand_over(control, pending) if pending else control

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
                control.should_training_stop |= handoff.stopped
                return control

        return Handoff()

    def hand_over(self, control: Any, metrics: Metrics) -> Any:
        """Hands ``metrics`` out and waits, like a generator paused at its yield."""
        found = dict(metrics)
        metrics.clear()
        if not self.hand(found):
            control.should_training_stop = True
        return control

    def stop(self) -> None:
        """Stops training after its current step."""
        self.stopped = True


def _floats(metrics: Mapping[str, Any], epoch: float | None) -> Metrics:
    """The numbers among ``metrics`` as floats, plus ``epoch``."""
    found = {
        k: v
        for k, v in as_metrics(metrics).items()
        if isinstance(v, float) and not k.endswith(TIMINGS)
    }
    if epoch is not None:
        found["epoch"] = float(epoch)
    return found
