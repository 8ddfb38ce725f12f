"""What every TensorFlow/Keras trainable shares: config, process setup, model parts, optimizer.

The twin of ``trainables.torch.common``. The config keys are the same names the PyTorch
trainables read (:mod:`trainables.knobs`), so one search space drives either framework. Data
lives in :mod:`trainables.tf.data`, the fit loop in :mod:`trainables.tf.loop`, the export hook
in :mod:`trainables.tf.export`, the replicas and their strategy in :mod:`trainables.tf.devices`
(threads and GPU memory are the framework's: :mod:`search.compute.limits`).

Only TensorFlow trainables import this module, so ``import trainables`` never imports TF.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Mapping
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TF loads: no C++ info lines

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from search import ConfigError, TrialContext  # noqa: E402
from trainables.knobs import (  # noqa: E402, F401  (the same knobs as the PyTorch twin)
    AUGMENT_DEFAULTS,
    CHOICES,
    COMMON_DEFAULTS,
    CYCLE_EPOCHS,
    PLATEAU_PATIENCE,
)
from trainables.knobs import read_config as _read_config  # noqa: E402
from trainables.tf import devices  # noqa: E402
from trainables.tf.data import Splits  # noqa: E402

POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
"""Keras dtype policy of each ``precision``."""


# --- config and process setup -------------------------------------------------------------


def read_config(
    config: Mapping[str, Any],
    defaults: Mapping[str, Any],
    choices: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, Any]:
    """:func:`trainables.knobs.read_config`, plus Keras' limit of one clipping option."""
    cfg = _read_config(config, defaults, choices)
    if cfg.get("clip_norm") and cfg.get("clip_value"):
        raise ConfigError("set clip_norm or clip_value, not both (a Keras optimizer takes one)")
    return cfg


def set_seed(seed: int) -> None:
    """Seeds Python's, NumPy's and TensorFlow's random generators (``keras.utils``)."""
    keras.utils.set_random_seed(int(seed) % 2**32)


def check_precision(precision: str, device: str) -> None:
    """Raises the one-line error for fp16 without a GPU (no loss-scaled fp16 kernels on CPU)."""
    if precision == "fp16" and device != "cuda":
        raise ConfigError("precision fp16 needs a GPU; use bf16 or fp32 on CPU")


def setup(
    config: Mapping[str, Any],
    defaults: Mapping[str, Any],
    ctx: TrialContext,
    choices: Mapping[str, tuple[str, ...]] | None = None,
) -> tuple[dict[str, Any], tf.distribute.Strategy]:
    """A trainable's first lines: config, precision check, fresh Keras, seed, strategy (the
    framework set the threads and GPUs up before, :mod:`search.compute.limits`).

    The twin of ``trainables.torch.common.setup``: the same arguments, and the same kind of
    return value, ``(cfg, device)``: the filled config and where the model trains.

    Returns:
        The filled config and the ``tf.distribute.Strategy`` to build the model in
        (:func:`model_scope`): mirrored over the trial's devices when it has several
        (:func:`trainables.tf.devices.strategy`), else the default one.
    """
    cfg = read_config(config, defaults, choices)
    device = "cuda" if ctx.device.startswith("cuda") else "cpu"
    check_precision(cfg["precision"], device)
    keras.backend.clear_session()  # trial processes are reused: drop the last trial's state
    set_seed(ctx.seed)
    return cfg, devices.strategy(ctx)


@contextlib.contextmanager
def model_scope(precision: str, strategy: tf.distribute.Strategy) -> Iterator[None]:
    """Where a trial's model is built and compiled: its dtype policy and device strategy.

    Layers take the policy when they are created, so it is needed only while building; it
    is reset to ``float32`` on the way out, because trial processes are reused. The strategy
    (what :func:`setup` returns) mirrors the model over the trial's devices when it has
    several; its variables are created here, so the model trains with it afterwards.
    """
    keras.mixed_precision.set_global_policy(POLICIES[precision])
    try:
        with strategy.scope():
            yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


# --- model parts ----------------------------------------------------------------------------


def normalization(splits: Splits) -> keras.layers.Normalization:
    """Per-channel standardization adapted on the training split only (no validation leak)."""
    layer = keras.layers.Normalization(axis=-1, dtype="float32")
    layer.adapt(splits.train.map(lambda x, y: x).batch(512))
    return layer


def model_inputs(
    cfg: Mapping[str, Any], splits: Splits, seed: int
) -> tuple[keras.KerasTensor, keras.KerasTensor]:
    """Every image model's first layers: the input, augmentation (training only, when the
    config asks for it) and standardization adapted on the training split.

    Returns:
        ``(inputs, x)``: the ``keras.Input`` and the standardized tensor to build on.
    """
    inputs = keras.Input(splits.input_shape)
    x = inputs
    augment = augmentation(cfg["augment"], cfg["hflip"], seed)
    if augment is not None:
        x = augment(x)
    return inputs, normalization(splits)(x)


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
    anneals to lr/25e4. ``plateau`` keeps a plain lr that
    :func:`trainables.tf.loop.stopping_callbacks` lowers.
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
        return sched.CosineDecay(
            lr / 25,
            decay_steps=max(1, total - warmup),
            alpha=1 / 25e4,
            warmup_target=lr,
            warmup_steps=warmup,
        )
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
    model.compile(
        optimizer=optimizer,
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        jit_compile=False,
    )
