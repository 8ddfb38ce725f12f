"""What every TensorFlow/Keras trainable shares: config, process setup, data, model parts, fit loop.

The config keys are the same names the PyTorch trainables read (``trainables._torch_common``),
so one search space drives either framework. They are duplicated here rather than imported,
because that module imports torch.

Per-epoch reporting (:func:`fit_epochs`): a generator and ``model.fit`` do not mix directly,
so the trainable calls ``model.fit(..., initial_epoch=e, epochs=e + 1)`` once per epoch and
yields what a small callback (:class:`EpochLogs`) captured at that epoch's end. Between two
yields Keras is idle, so when ASHA stops the trial the framework just closes the generator.
Keras' ``EarlyStopping`` and ``ReduceLROnPlateau`` reset their counters in
``on_train_begin``, i.e. at every ``fit`` call; the ``Persistent*`` subclasses here run that
reset only once, so patience counts across the per-epoch calls. The compiled train/test
functions are cached on the model, so one ``fit`` per epoch costs no retracing.

Only TensorFlow trainables import this module, so ``import trainables`` never imports TF.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TF loads: no C++ info lines

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from search.data import Dataset  # noqa: E402
from search.trainable import Metrics, TrialContext, train_to_end  # noqa: E402
from trainables._knobs import (  # noqa: F401  (the same knobs as the PyTorch twin)
    AUGMENT_DEFAULTS,
    CHOICES,
    COMMON_DEFAULTS,
    CYCLE_EPOCHS,
    PLATEAU_PATIENCE,
)
from trainables._knobs import read_config as _read_config

POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
"""Keras dtype policy of each ``precision``."""

_configured: dict[str, Any] = {}


# --- config and process setup -------------------------------------------------------------


def read_config(
    config: Mapping[str, Any],
    defaults: Mapping[str, Any],
    choices: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, Any]:
    """:func:`trainables._knobs.read_config`, plus Keras' limit of one clipping option."""
    cfg = _read_config(config, defaults, choices)
    if cfg.get("clip_norm") and cfg.get("clip_value"):
        raise ValueError("set clip_norm or clip_value, not both (a Keras optimizer takes one)")
    return cfg


def configure_tf(num_threads: int, device: str) -> None:
    """Sets TF's thread pools and GPU memory growth, once per process, before any op runs.

    Memory growth on every visible GPU lets several TF trials share one GPU. A ``cpu`` trial
    hides the GPUs. TF fixes these settings when its runtime starts, so a later call (a reused
    trial process) keeps the first trial's settings.

    Args:
        num_threads: Threads for TF's intra- and inter-op pools.
        device: ``"cuda"`` or ``"cpu"`` (:attr:`TrialContext.device`).
    """
    if _configured:
        return
    threads = max(1, int(num_threads))
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
        if device == "cpu":
            tf.config.set_visible_devices([], "GPU")
        else:
            for gpu in tf.config.list_physical_devices("GPU"):
                tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:  # the runtime already started (TF used before the first trial)
        pass
    _configured.update(num_threads=threads, device=device)


def set_seed(seed: int) -> None:
    """Seeds Python's, NumPy's and TensorFlow's random generators (``keras.utils``)."""
    keras.utils.set_random_seed(int(seed) % 2**32)


def check_precision(precision: str, device: str) -> None:
    """Raises the one-line error for fp16 without a GPU (no loss-scaled fp16 kernels on CPU)."""
    if precision == "fp16" and device != "cuda":
        raise ValueError("precision fp16 needs a GPU; use bf16 or fp32 on CPU")


def setup(
    config: Mapping[str, Any],
    defaults: Mapping[str, Any],
    ctx: TrialContext,
    choices: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, Any]:
    """A trainable's first lines: config, precision check, threads and GPUs, fresh Keras, seed.

    Returns:
        The filled config.
    """
    cfg = read_config(config, defaults, choices)
    device = "cuda" if ctx.device.startswith("cuda") else "cpu"
    check_precision(cfg["precision"], device)
    configure_tf(ctx.num_threads, device)
    keras.backend.clear_session()  # trial processes are reused: drop the last trial's state
    set_seed(ctx.seed)
    return cfg


@contextlib.contextmanager
def precision_policy(precision: str) -> Iterator[None]:
    """Sets Keras' global dtype policy for building and compiling one trial's model.

    Layers take the policy when they are created, so it is needed only while building; it
    is reset to ``float32`` on the way out, because trial processes are reused.
    """
    keras.mixed_precision.set_global_policy(POLICIES[precision])
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


# --- data ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Splits:
    """Unbatched ``(image HWC float32 in [0, 1], int label)`` datasets, training and validation."""

    train: tf.data.Dataset
    val: tf.data.Dataset
    n_train: int
    input_shape: tuple[int, int, int]
    num_classes: int


def subsample(data: Dataset, fraction: float, seed: int = 0) -> Dataset:
    """``data`` with a stratified ``fraction`` of its training split, the same in every trial."""
    if fraction >= 1.0 or len(data.y_train) == 0:
        return data
    from sklearn.model_selection import train_test_split

    n_keep = max(data.num_classes, round(fraction * len(data.y_train)))
    x, _, y, _ = train_test_split(data.x_train, data.y_train, train_size=n_keep,
                                  random_state=seed, stratify=data.y_train)
    return dataclasses.replace(data, x_train=x, y_train=y)


def from_arrays(data: Dataset) -> Splits:
    """The framework's ``(n, C, H, W)`` arrays as NHWC datasets, scaled by the training max."""
    scale = float(max(data.x_train.max(), 1e-8))

    def images(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1), dtype=np.float32) / scale

    x_train, x_val = images(data.x_train), images(data.x_val)
    return Splits(
        train=tf.data.Dataset.from_tensor_slices((x_train, data.y_train.astype(np.int32))),
        val=tf.data.Dataset.from_tensor_slices((x_val, data.y_val.astype(np.int32))),
        n_train=len(x_train),
        input_shape=tuple(x_train.shape[1:]),
        num_classes=int(data.num_classes),
    )


def load_image_folder(path: str, val_fraction: float, seed: int, image_size: int) -> Splits:
    """Images in one subfolder per class, split reproducibly and resized to ``image_size``.

    Args:
        path: Folder with a subfolder per class (``path/<class>/*.png``, jpg, bmp, gif).
        val_fraction: Share of the files that go to validation.
        seed: Seed of the split (the same files go to validation in every trial).
        image_size: Height and width the images are resized to.
    """
    train, val = keras.utils.image_dataset_from_directory(
        path, validation_split=val_fraction, subset="both", seed=seed,
        image_size=(image_size, image_size), batch_size=None, color_mode="rgb",
    )
    num_classes = len(train.class_names)

    def scaled(ds: tf.data.Dataset) -> tf.data.Dataset:
        return ds.map(lambda x, y: (x / 255.0, y), num_parallel_calls=tf.data.AUTOTUNE)

    n_train = int(train.cardinality())
    return Splits(scaled(train), scaled(val), n_train, (image_size, image_size, 3), num_classes)


def load_splits(data: Dataset, ctx: TrialContext, image_size: int | None = None) -> Splits:
    """An image folder when ``ctx.extras["data_path"]`` is set, else the arrays of ``data``.

    Folder options come from ``ctx.extras`` too: ``val_fraction`` (0.2), ``split_seed`` (0),
    ``image_size`` (32, or the trainable's own ``image_size``).
    """
    path = ctx.extras.get("data_path")
    if not path:
        return from_arrays(data)
    size = int(image_size or ctx.extras.get("image_size", 32))
    val_fraction = float(ctx.extras.get("val_fraction", 0.2))
    return load_image_folder(str(path), val_fraction, int(ctx.extras.get("split_seed", 0)), size)


def pipeline(
    ds: tf.data.Dataset, batch_size: int, num_threads: int, shuffle_seed: int | None = None
) -> tf.data.Dataset:
    """Cache, (shuffle,) batch and prefetch; tf.data's threads are capped at ``num_threads``.

    Args:
        ds: Unbatched ``(image, label)`` pairs.
        batch_size: Examples per batch.
        num_threads: Size of the dataset's private thread pool (the trial's CPU share).
        shuffle_seed: Reshuffle every epoch from this seed; ``None`` keeps the order.
    """
    ds = ds.cache()
    if shuffle_seed is not None:
        ds = ds.shuffle(10_000, seed=shuffle_seed, reshuffle_each_iteration=True)
    options = tf.data.Options()
    options.threading.private_threadpool_size = max(1, num_threads)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE).with_options(options)


# --- model parts ----------------------------------------------------------------------------


def normalization(splits: Splits) -> keras.layers.Normalization:
    """Per-channel standardization adapted on the training split only (no validation leak)."""
    layer = keras.layers.Normalization(axis=-1, dtype="float32")
    layer.adapt(splits.train.map(lambda x, y: x).batch(512))
    return layer


def augmentation(strength: float, hflip: bool, seed: int) -> keras.Sequential | None:
    """Random rotation, translation, brightness and contrast scaled by ``strength``.

    At ``strength`` 1: rotation up to 15 degrees, translation up to 10 % of the image,
    brightness shifts up to 0.3 and contrast factors in [0.7, 1.3], on images in [0, 1]; the
    uncovered border is filled with 0. Keras' random layers act only in training.

    Returns:
        The augmentation layers, or None when ``strength`` is 0 and ``hflip`` is off.
    """
    steps: list[keras.layers.Layer] = []
    if strength > 0:
        shift = 0.1 * strength
        steps += [
            keras.layers.RandomRotation(15 * strength / 360, fill_mode="constant", seed=seed),
            keras.layers.RandomTranslation(shift, shift, fill_mode="constant", seed=seed + 1),
            keras.layers.RandomBrightness(0.3 * strength, value_range=(0, 1), seed=seed + 2),
            keras.layers.RandomContrast(0.3 * strength, value_range=(0, 1), seed=seed + 3),
        ]
    if hflip:
        steps.append(keras.layers.RandomFlip("horizontal", seed=seed + 4))
    return keras.Sequential(steps, name="augment") if steps else None


def regularizer(cfg: Mapping[str, Any]) -> keras.regularizers.Regularizer | None:
    """L1 plus coupled L2 on kernels; AdamW's weight decay is decoupled (in the optimizer).

    Keras' ``l2(c)`` adds ``c * sum(w**2)``, whose gradient ``2 c w`` equals torch's
    ``weight_decay * w`` for ``c = weight_decay / 2``.
    """
    l2 = cfg["weight_decay"] / 2 if cfg["optimizer"] != "adamw" else 0.0
    if not (cfg["l1"] or l2):
        return None
    return keras.regularizers.L1L2(l1=cfg["l1"], l2=l2)


# --- optimizer and schedule -----------------------------------------------------------------


@keras.saving.register_keras_serializable(package="search")
class TriangularCyclicLR(keras.optimizers.schedules.LearningRateSchedule):
    """Triangular cyclic lr (torch's ``CyclicLR``): ``base_lr`` up to ``max_lr`` and back.

    Args:
        base_lr: Lowest lr, at step 0 and at every full period.
        max_lr: Highest lr, after ``step_size_up`` steps.
        step_size_up: Steps of each half-period.
    """

    def __init__(self, base_lr: float, max_lr: float, step_size_up: int) -> None:
        self.base_lr, self.max_lr, self.step_size_up = base_lr, max_lr, step_size_up

    def __call__(self, step: Any) -> Any:
        up = float(self.step_size_up)
        phase = keras.ops.mod(keras.ops.cast(step, "float32"), 2 * up) / up  # in [0, 2)
        return self.base_lr + (self.max_lr - self.base_lr) * (1 - keras.ops.abs(phase - 1))

    def get_config(self) -> dict[str, Any]:
        return {"base_lr": self.base_lr, "max_lr": self.max_lr, "step_size_up": self.step_size_up}


def learning_rate(
    cfg: Mapping[str, Any], max_epochs: int, steps_per_epoch: int
) -> float | keras.optimizers.schedules.LearningRateSchedule:
    """The lr or a per-batch schedule with the PyTorch twin's shapes.

    ``step`` decays by ``gamma`` every ``step_size`` epochs, ``cosine`` anneals to 0 over
    ``max_epochs``, ``cyclic`` is triangular between lr/10 and lr (half-period
    :data:`CYCLE_EPOCHS`), ``onecycle`` warms up from lr/25 to lr over 30 % of the run, then
    anneals to lr/25e4. ``plateau`` keeps a plain lr that :func:`stopping_callbacks` lowers.
    """
    name, lr, sched = cfg["lr_scheduler"], cfg["lr"], keras.optimizers.schedules
    total = max(1, max_epochs * steps_per_epoch)
    if name == "step":
        step_size = int(cfg["step_size"] or max(1, max_epochs // 3))
        return sched.ExponentialDecay(lr, step_size * steps_per_epoch, cfg["gamma"], staircase=True)
    if name == "cosine":
        return sched.CosineDecay(lr, decay_steps=total)
    if name == "cyclic":
        return TriangularCyclicLR(lr / 10, lr, max(1, CYCLE_EPOCHS * steps_per_epoch))
    if name == "onecycle":
        warmup = max(1, int(0.3 * total))
        return sched.CosineDecay(lr / 25, decay_steps=max(1, total - warmup), alpha=1 / 25e4,
                                 warmup_target=lr, warmup_steps=warmup)
    return lr


def build_optimizer(
    cfg: Mapping[str, Any], lr: float | keras.optimizers.schedules.LearningRateSchedule
) -> keras.optimizers.Optimizer:
    """SGD (with ``momentum``), Adam, or AdamW (decoupled ``weight_decay``), with clipping.

    ``clip_norm`` clips the global norm of all gradients (torch's ``clip_grad_norm_``), so it
    sets ``global_clipnorm``; ``clip_value`` sets ``clipvalue``.
    """
    clip = {"global_clipnorm": cfg["clip_norm"] or None, "clipvalue": cfg["clip_value"] or None}
    if cfg["optimizer"] == "sgd":
        return keras.optimizers.SGD(learning_rate=lr, momentum=cfg["momentum"], **clip)
    if cfg["optimizer"] == "adam":
        return keras.optimizers.Adam(learning_rate=lr, **clip)
    return keras.optimizers.AdamW(learning_rate=lr, weight_decay=cfg["weight_decay"], **clip)


def compile_model(
    model: keras.Model, cfg: Mapping[str, Any], max_epochs: int, n_train: int
) -> None:
    """Compiles with the config's optimizer and schedule, sparse cross-entropy and accuracy."""
    steps_per_epoch = max(1, math.ceil(n_train / cfg["batch_size"]))
    optimizer = build_optimizer(cfg, learning_rate(cfg, max_epochs, steps_per_epoch))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=False)


# --- per-epoch fit loop ---------------------------------------------------------------------


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
        callbacks.append(PersistentReduceLROnPlateau(
            monitor="val_loss", factor=cfg["gamma"], patience=PLATEAU_PATIENCE + 1, verbose=0))
    if cfg["early_stopping_patience"] > 0:
        callbacks.append(PersistentEarlyStopping(
            monitor="val_loss", patience=cfg["early_stopping_patience"],
            min_delta=cfg["early_stopping_min_delta"], verbose=0))
    return callbacks


def fit_epochs(
    model: keras.Model,
    train: tf.data.Dataset,
    val: tf.data.Dataset,
    ctx: TrialContext,
    callbacks: Sequence[keras.callbacks.Callback] = (),
) -> Iterator[Metrics]:
    """Trains one epoch per ``fit`` call and yields that epoch's metrics (see module doc).

    Yields:
        ``train_loss``, ``train_accuracy``, ``val_loss``, ``val_accuracy``, ``lr`` (at the
        epoch's start) and ``epoch_time_s`` (the whole ``fit`` call), once per epoch, at
        most ``ctx.max_epochs`` times.
        Returns after the epoch in which a callback set ``model.stop_training``.
    """
    logs = EpochLogs()
    all_callbacks = [logs, *callbacks]  # the same objects every epoch: their state persists
    first = 0
    if ctx.restore_dir is not None:  # a retried trial continues after its last checkpoint
        first = load_state(model, callbacks, ctx.restore_dir)
    for epoch in range(first, ctx.max_epochs):
        start = time.perf_counter()
        model.fit(train, validation_data=val, initial_epoch=epoch, epochs=epoch + 1,
                  callbacks=all_callbacks, shuffle=False, verbose=0)  # pipeline shuffles
        if ctx.checkpoint_dir is not None:
            save_state(model, callbacks, epoch + 1, ctx.checkpoint_dir)
        yield {**logs.metrics, "epoch_time_s": time.perf_counter() - start}
        if model.stop_training:  # fit() clears it on entry; set by EarlyStopping
            return


# --- checkpoints (a retried trial continues after its last epoch) ----------------------------

WEIGHTS_FILE = "model.weights.h5"
STATE_FILE = "state.json"
_COUNTERS = ("wait", "best", "best_epoch", "stopped_epoch", "cooldown_counter")
"""Attributes of Keras' EarlyStopping and ReduceLROnPlateau that carry their patience."""


def _scalar(value: Any) -> Any:
    return float(value) if isinstance(value, float | np.floating) else value


def save_state(model: keras.Model, callbacks: Sequence[keras.callbacks.Callback], epoch: int,
               folder: str) -> None:
    """Writes what a retried trial needs to continue after ``epoch`` into ``folder``.

    ``model.weights.h5`` (Keras 3 writes the model's weights, normalization statistics
    included, and the optimizer's variables: step count, the learning rate as the plateau
    callback left it, moments) and ``state.json`` (the epoch and the patience counters of
    the stopping callbacks). Files are overwritten each epoch.
    """
    from pathlib import Path

    path = Path(folder)
    model.save_weights(path / WEIGHTS_FILE, overwrite=True)
    counters = [{k: _scalar(getattr(cb, k)) for k in _COUNTERS
                 if isinstance(getattr(cb, k, None), int | float | np.number)}
                for cb in callbacks]
    state = {"epoch": epoch, "callbacks": counters}
    (path / STATE_FILE).write_text(json.dumps(state))


def load_state(model: keras.Model, callbacks: Sequence[keras.callbacks.Callback],
               folder: str) -> int:
    """Restores what :func:`save_state` wrote; returns the epoch it was saved after.

    The data order is not part of the state: the restored run's shuffles start afresh from
    the trial's seed, so it continues the run closely, not bit for bit.
    """
    from pathlib import Path

    path = Path(folder)
    model.optimizer.build(model.trainable_variables)  # its variables must exist to be loaded
    model.load_weights(path / WEIGHTS_FILE)
    state = json.loads((path / STATE_FILE).read_text())
    for cb, counters in zip(callbacks, state["callbacks"], strict=False):
        if isinstance(cb, _KeepStateAcrossFits):
            cb.on_train_begin()  # the one reset, now; the saved counters then overwrite it
        for key, value in counters.items():
            setattr(cb, key, value)
    return int(state["epoch"])


def expose_model(model: keras.Model, ctx: TrialContext) -> None:
    """Puts ``model`` into ``ctx.extras["model_out"]["model"]`` when that is a dict."""
    out = ctx.extras.get("model_out")
    if isinstance(out, dict):
        out["model"] = model


# --- export hook (python -m search export) ---------------------------------------------------


def export_keras(train: Any, config: Mapping[str, Any], data: Dataset, ctx: TrialContext,
                 out_dir: Any) -> Metrics:
    """Trains ``config`` with the trainable ``train`` to its end, then saves the model.

    Writes ``model.keras`` (reload with ``keras.models.load_model``) and ``saved_model/``
    (``model.export``: a TF SavedModel whose ``serve`` signature takes NHWC float32 images
    scaled to [0, 1] by ``input_scale``, the training split's largest value, and returns
    class probabilities). The reloaded ``.keras`` file is scored on the validation split.

    Returns:
        The last epoch's metrics and ``epochs``, plus ``export_val_loss`` and
        ``export_val_accuracy`` (the reloaded file) and ``input_scale`` (arrays only).
    """
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    handle, last, epochs = train_to_end(train, config, data, ctx)
    model = handle["model"]
    model.save(out / "model.keras")
    model.export(str(out / "saved_model"), format="tf_saved_model", verbose=False)
    reloaded = keras.models.load_model(out / "model.keras")
    splits = load_splits(data, ctx)
    val_loss, val_accuracy = reloaded.evaluate(
        pipeline(splits.val, int(config.get("batch_size", 64)), ctx.num_threads), verbose=0)
    scale = {} if ctx.extras.get("data_path") else {"input_scale": float(data.x_train.max())}
    return {**last, "epochs": float(epochs), "export_val_loss": float(val_loss),
            "export_val_accuracy": float(val_accuracy), **scale}


def train_compiled(
    model: keras.Model, splits: Any, cfg: Mapping[str, Any], ctx: TrialContext
) -> Iterator[Metrics]:
    """The tail every TF trainable shares: expose the model, build the pipelines, fit."""
    expose_model(model, ctx)
    train_ds = pipeline(splits.train, cfg["batch_size"], ctx.num_threads, ctx.seed)
    val_ds = pipeline(splits.val, cfg["batch_size"], ctx.num_threads)
    yield from fit_epochs(model, train_ds, val_ds, ctx, stopping_callbacks(cfg))
