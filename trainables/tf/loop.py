"""The TensorFlow trainables' fit loop: one ``fit`` per epoch, checkpoints, the model handle.

The twin of ``trainables.torch.loop``. A trainable builds and compiles its model, then
``yield from fit_epochs(model, splits, cfg, ctx, strategy)``; each epoch yields::

    train_loss, train_accuracy   over the epoch's training batches (Keras' running means)
    val_loss, val_accuracy       on the whole validation split
    lr                           learning rate the epoch started with
    epoch_time_s                 wall time of the epoch (the whole ``fit`` call)
    replicas                     devices the model is mirrored over (1 without mirroring)

A generator and ``model.fit`` do not mix directly, so :func:`fit_epochs` calls
``model.fit(..., initial_epoch=e, epochs=e + 1)`` once per epoch and yields what a small
callback (:class:`EpochLogs`) captured at that epoch's end. Between two yields Keras is idle,
so when ASHA stops the trial the framework just closes the generator. Keras' ``EarlyStopping``
and ``ReduceLROnPlateau`` reset their counters in ``on_train_begin``, i.e. at every ``fit``
call; the ``Persistent*`` subclasses here run that reset only once, so patience counts across
the per-epoch calls. The compiled train/test functions are cached on the model, so one
``fit`` per epoch costs no retracing. A model built in a ``MirroredStrategy`` scope
(:func:`trainables.tf.devices.strategy`) trains the same way: Keras splits each global batch
over the replicas.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from search import Metrics, TrialContext
from trainables.knobs import PLATEAU_PATIENCE
from trainables.tf.data import Splits, pipeline


class _KeepStateAcrossFits(keras.callbacks.Callback):
    """Runs the parent's ``on_train_begin`` (which resets its counters) in the first fit only."""

    _begun = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not self._begun:
            self._begun = True
            super().on_train_begin(logs)


class PersistentEarlyStopping(_KeepStateAcrossFits, keras.callbacks.EarlyStopping):
    """``EarlyStopping`` whose patience counts across one-epoch ``fit`` calls."""


class PersistentReduceLROnPlateau(_KeepStateAcrossFits, keras.callbacks.ReduceLROnPlateau):
    """``ReduceLROnPlateau`` whose patience counts across one-epoch ``fit`` calls."""


class EpochLogs(keras.callbacks.Callback):
    """Captures the last epoch's logs and the lr that epoch started with."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: Metrics = {}
        self._lr = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._lr = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = logs or {}
        self.metrics = {
            "train_loss": float(logs["loss"]),
            "train_accuracy": float(logs["accuracy"]),
            "val_loss": float(logs["val_loss"]),
            "val_accuracy": float(logs["val_accuracy"]),
            "lr": self._lr,
        }


def stopping_callbacks(cfg: Mapping[str, Any]) -> list[keras.callbacks.Callback]:
    """Early stopping on val_loss (``early_stopping_patience`` > 0) and the ``plateau`` lr."""
    callbacks: list[keras.callbacks.Callback] = []
    if cfg["lr_scheduler"] == "plateau":
        # torch reduces after ``patience`` bad epochs *plus one*, Keras after ``patience``.
        callbacks.append(
            PersistentReduceLROnPlateau(
                monitor="val_loss", factor=cfg["gamma"], patience=PLATEAU_PATIENCE + 1, verbose=0
            )
        )
    if cfg["early_stopping_patience"] > 0:
        callbacks.append(
            PersistentEarlyStopping(
                monitor="val_loss",
                patience=cfg["early_stopping_patience"],
                min_delta=cfg["early_stopping_min_delta"],
                verbose=0,
            )
        )
    return callbacks


def _fit_each_epoch(
    model: keras.Model,
    train: tf.data.Dataset,
    val: tf.data.Dataset,
    ctx: TrialContext,
    callbacks: Sequence[keras.callbacks.Callback],
) -> Iterator[Metrics]:
    """One ``fit`` call per epoch, yielding that epoch's metrics (see the module doc).

    With ``ctx.checkpoint_dir`` it saves its state (the stopping callbacks' counters updated
    by the epoch) before each yield; with ``ctx.restore_dir`` it continues after the saved
    epoch. Returns after the epoch in which a callback set ``model.stop_training``.
    """
    logs = EpochLogs()
    all_callbacks = [logs, *callbacks]  # the same objects every epoch: their state persists
    first = 0 if ctx.restore_dir is None else load_state(model, callbacks, ctx.restore_dir)
    for epoch in range(first, ctx.max_epochs):
        start = time.perf_counter()
        model.fit(
            train,
            validation_data=val,
            initial_epoch=epoch,
            epochs=epoch + 1,
            callbacks=all_callbacks,
            shuffle=False,
            verbose=0,
        )  # pipeline shuffles
        if ctx.checkpoint_dir is not None:
            save_state(model, callbacks, epoch + 1, ctx.checkpoint_dir)
        yield {**logs.metrics, "epoch_time_s": time.perf_counter() - start}
        if model.stop_training:  # fit() clears it on entry; set by EarlyStopping
            return


LATENCY_RUNS = 20
"""Timed forward passes behind ``latency_ms`` (the median; 3 more warm up first)."""


def model_costs(model: keras.Model, example: tf.Tensor) -> Metrics:
    """What serving the model costs: ``latency_ms`` (the median forward pass at batch 1),
    ``params`` and ``model_mb`` (its weights' bytes, in MiB). The twin of
    :func:`trainables.torch.loop.model_costs`."""
    x = example[:1]
    times = []
    for run in range(LATENCY_RUNS + 3):
        start = time.perf_counter()
        model(x, training=False)
        if run >= 3:
            times.append(time.perf_counter() - start)
    sizes = [(int(np.prod(w.shape)), np.dtype(w.dtype).itemsize) for w in model.weights]
    return {
        "latency_ms": 1000.0 * sorted(times)[len(times) // 2],
        "params": float(sum(n for n, _ in sizes)),
        "model_mb": sum(n * size for n, size in sizes) / 2**20,
    }


# --- checkpoints (a retried trial continues after its last epoch) ----------------------------

WEIGHTS_FILE = "model.weights.h5"
STATE_FILE = "state.json"
_COUNTERS = ("wait", "best", "best_epoch", "stopped_epoch", "cooldown_counter")
"""Attributes of Keras' EarlyStopping and ReduceLROnPlateau that carry their patience."""


def _scalar(value: Any) -> Any:
    return float(value) if isinstance(value, float | np.floating) else value


def save_state(
    model: keras.Model, callbacks: Sequence[keras.callbacks.Callback], epoch: int, folder: str
) -> None:
    """Writes what a retried trial needs to continue after ``epoch`` into ``folder``.

    ``model.weights.h5`` (Keras 3 writes the model's weights, normalization statistics
    included, and the optimizer's variables: step count, the learning rate as the plateau
    callback left it, moments) and ``state.json`` (the epoch and the patience counters of
    the stopping callbacks). Files are overwritten each epoch.
    """
    path = Path(folder)
    model.save_weights(path / WEIGHTS_FILE, overwrite=True)
    counters = [
        {
            k: _scalar(getattr(cb, k))
            for k in _COUNTERS
            if isinstance(getattr(cb, k, None), int | float | np.number)
        }
        for cb in callbacks
    ]
    state = {"epoch": epoch, "callbacks": counters}
    (path / STATE_FILE).write_text(json.dumps(state))


def load_state(
    model: keras.Model, callbacks: Sequence[keras.callbacks.Callback], folder: str
) -> int:
    """Restores what :func:`save_state` wrote; returns the epoch it was saved after.

    The data order is not part of the state: the restored run's shuffles start afresh from
    the trial's seed, so it continues the run closely, not bit for bit.
    """
    path = Path(folder)
    with model.distribute_strategy.scope():  # mirrored variables when it has replicas
        model.optimizer.build(model.trainable_variables)  # they must exist to be loaded
        model.load_weights(path / WEIGHTS_FILE)
    state = json.loads((path / STATE_FILE).read_text())
    for cb, counters in zip(callbacks, state["callbacks"], strict=False):
        if isinstance(cb, _KeepStateAcrossFits):
            cb.on_train_begin()  # the one reset, now; the saved counters then overwrite it
        for key, value in counters.items():
            setattr(cb, key, value)
    return int(state["epoch"])


Fitted = tuple[keras.Model, Splits]
"""What :func:`fit_epochs` returns after its last epoch: the model and its data."""


# --- the loop every TF trainable runs ----------------------------------------------------------


def fit_epochs(
    model: keras.Model,
    splits: Splits,
    cfg: Mapping[str, Any],
    ctx: TrialContext,
    strategy: tf.distribute.Strategy,
) -> Generator[Metrics, None, Fitted]:
    """Trains the compiled ``model`` for up to ``ctx.max_epochs`` epochs, one dict each.

    Returns early (the trial ends COMPLETE) when early stopping triggers on val_loss. The
    twin of :func:`trainables.torch.loop.fit_epochs`; ``strategy`` is the one the model was
    built in (:func:`trainables.tf.common.setup`), and its replica count is reported.

    Returns:
        ``(model, splits)`` after the last epoch (:data:`Fitted`), for an export hook.
    """
    train_ds = pipeline(splits.train, cfg["batch_size"], ctx.num_threads, ctx.seed)
    val_ds = pipeline(splits.val, cfg["batch_size"], ctx.num_threads)
    replicas = float(strategy.num_replicas_in_sync)
    example = next(iter(splits.val.batch(1)))[0]
    costs: Metrics = {}  # measured once, after the first epoch (they depend on the config only)
    for metrics in _fit_each_epoch(model, train_ds, val_ds, ctx, stopping_callbacks(cfg)):
        costs = costs or model_costs(model, example)
        yield {**metrics, **costs, "replicas": replicas}
    return model, splits
