"""What a trainable receives: :class:`TrialContext`, and the shape of what it yields.

A trainable is a plain generator function, independent of Ray and Optuna::

    def train(config: dict, data: Dataset, ctx: TrialContext) -> Iterator[dict[str, float]]:
        model = build(config)
        for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
            ...
            yield {"val_accuracy": acc, "val_loss": loss, "train_loss": tl}

It yields one metrics dict per epoch it trained (:mod:`search.contract.driver` drives it).
When ASHA stops the trial, the generator is simply closed. A trainable that stops early on its
own rule just returns. It may ``return model`` at its end: an export hook gets that object from
:func:`~search.contract.driver.train_to_end`. Keys that start with :data:`RESERVED_PREFIX`
belong to the framework and must not be yielded.

Everything a trainable needs from the framework is a typed field of :class:`TrialContext`;
``extras`` holds only what a user's own code chooses to read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from search.contract.dataset import Dataset

RESERVED_PREFIX = "search/"
"""Prefix of the framework's own keys in configs and reported results."""

Metrics = dict[str, float]
TrainFn = Callable[[Mapping[str, Any], "Dataset", "TrialContext"], Iterator[Metrics]]
ExportFn = Callable[[Mapping[str, Any], "Dataset", "TrialContext", Path], Metrics]


class ConfigError(ValueError):
    """A config the trainable cannot use (an unknown knob, a value out of range).

    It fails the same way every time, so the framework does not retry the trial.
    """


@dataclass(frozen=True)
class TrialContext:
    """What the framework tells a trainable about the trial it runs.

    Args:
        max_epochs: The most epochs the trial may train (the study's budget).
        seed: Seed for every random generator of this trial.
        num_threads: CPU threads the trial may use (its share of the machine).
        device: ``"cuda"`` when Ray gave the trial a GPU, else ``"cpu"``.
        trial_number: The Optuna trial number (0 for a run outside a study).
        trial_dir: A folder the trial may write into (profiles, artifacts). A retry may
            start in a fresh one: state that must survive a retry goes into
            ``checkpoint_dir``.
        extras: Free-form options for the trainable's own use; the framework reads none.
        checkpoint_dir: When set, a folder the trainable should write its state into (model,
            optimizer, scheduler; overwriting) just before each ``yield``. The framework turns
            it into that epoch's Ray Tune checkpoint. A trainable that writes nothing simply
            restarts from scratch when its trial is retried.
        restore_dir: When set, the trial is being retried: load the state saved there and
            continue with the epoch after ``start_epoch - 1``.
        start_epoch: The number of the first epoch this call yields (1, or later on restore).
        gpu_share: The share of a GPU Ray holds for the trial (``None``: no GPU).
        gpu_memory_fraction: The cap on the trial's GPU memory, as a share of the GPU, when
            trials share a GPU. The framework applies it before the trainable runs (PyTorch:
            ``PYTORCH_CUDA_ALLOC_CONF``; TensorFlow: a logical device of that size); a
            trainable only reads it.
        data_path: The folder of an ``image_folder`` dataset (``None`` otherwise).
        replicas: The devices an ``in_process`` data-parallel trial spreads over.
        rank: This process's rank in a ``processes`` data-parallel trial (0 reports).
        world_size: How many processes train the trial together (1: no data parallelism).
        gpu_total_bytes: The memory of the trial's GPU, when the framework measured it.
        max_steps: When set, train at most this many batches per epoch (a memory probe).
        profile: Whether this trial should profile itself (the spec's ``profile`` chose it).
        history: When a list, :func:`~search.contract.driver.train_to_end` appends each
            epoch's metrics to it (an export's learning curve).

    Example:
        >>> ctx = TrialContext(max_epochs=3, seed=7)
        >>> list(range(ctx.start_epoch, ctx.max_epochs + 1))
        [1, 2, 3]
    """

    max_epochs: int
    seed: int = 0
    num_threads: int = 1
    device: str = "cpu"
    trial_number: int = 0
    trial_dir: str = "."
    extras: Mapping[str, Any] = field(default_factory=dict)
    checkpoint_dir: str | None = None
    restore_dir: str | None = None
    start_epoch: int = 1
    gpu_share: float | None = None
    gpu_memory_fraction: float | None = None
    data_path: str | None = None
    replicas: int = 1
    rank: int = 0
    world_size: int = 1
    gpu_total_bytes: int | None = None
    max_steps: int | None = None
    profile: bool = False
    history: list[Metrics] | None = None
