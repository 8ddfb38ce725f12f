"""A user's Keras ``model.fit`` as a trainable: one ``fit`` call, one yield per epoch.

A trainable builds and compiles its own Keras 3 model (TensorFlow backend) and hands the rest
to :func:`fit`::

    import search.keras
    from search import trainable

    @trainable(defaults={"lr": 1e-2, "batch_size": 16})
    def train(config, data, ctx):
        model = build(config)              # the user's own Keras model, compiled
        return (yield from search.keras.fit(
            model, ctx, x_train, y_train,
            validation_data=(x_val, y_val), batch_size=config["batch_size"],
        ))                                 # returns the model, for the export hook

    @train.exporter
    def export(config, data, ctx, out_dir):  # train to the end, save model.keras
        return search.keras.train_and_save(train, config, data, ctx, out_dir)

**Why a thread.** A generator must pause at ``yield``; ``model.fit`` only calls back. So
:func:`fit` runs the unchanged ``model.fit`` once, in a background thread, and a last
callback hands each epoch's logs to the generator and then *waits* until the generator is
asked for the next epoch, as if ``fit`` were paused at a ``yield``. Only one thread works at
a time and no epoch runs ahead of the study. Closing the generator (ASHA's prune, the epoch
budget) sets ``model.stop_training``, releases the callback and joins the thread; an exception
in ``fit`` is raised in the caller. Because ``fit`` runs once, user callbacks such as
``EarlyStopping`` keep their state across epochs; when one stops training the generator ends.
Nothing in Keras 3 or TensorFlow needs the main thread (Ray Tune already runs trainables off
it), but Keras and TF keep some *scopes* per thread: ``with tf.device(...)``, strategy and
``custom_object_scope`` blocks around ``yield from fit(...)`` do not reach the fit thread, and
a global dtype policy must be set before the model is built (as Keras wants anyway).

**Checkpoints.** With ``ctx.checkpoint_dir`` every epoch end writes, before its logs are
handed out, ``model.weights.h5`` (``model.save_weights``: weights and the optimizer's
variables, its step count included) and ``state.json`` (the epoch and the patience counters
of the user's callbacks). Weights, not a ``model.keras`` archive: they need no serializable
model config (subclassed models often have none), and the user's own model object is
restored in place. With ``ctx.restore_dir`` :func:`fit` loads them before ``fit`` (so the
model must be built, e.g. start with ``keras.Input``, as Keras' own ``BackupAndRestore``
requires), sets the counters back after the callbacks' ``on_train_begin``, and continues at
``ctx.start_epoch``. ``EarlyStopping``'s ``best_weights`` and the data order are not restored.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from search.contract import Metrics, TrainFn, TrialContext, as_metrics, train_to_end
from search.contract.driver import as_number
from search.contract.handoff import Handoff, drive
from search.contract.inputs import graph_tensors, write_inputs

if TYPE_CHECKING:
    from search.contract import Dataset

WEIGHTS_FILE = "model.weights.h5"
STATE_FILE = "state.json"
MODEL_FILE = "model.keras"
ONNX_FILE = "model.onnx"
ONNX_TOLERANCE = 1e-4
ONNX_OPSET = 17
"""Largest absolute difference allowed between ONNX Runtime's outputs and Keras'."""
_COUNTERS = ("wait", "best", "best_epoch", "stopped_epoch", "cooldown_counter")
"""Attributes of Keras' EarlyStopping and ReduceLROnPlateau that carry their patience."""


def set_threads(ctx: TrialContext) -> bool:
    """Deprecated, and no longer needed: the framework sets TensorFlow's thread pools (and its
    GPUs, and a packed trial's memory cap) before the trainable runs, also when it imports
    TensorFlow inside its function (``search.compute.limits``). Sets nothing.

    Returns:
        Whether both of TensorFlow's thread pools hold ``ctx.num_threads``.
    """
    import tensorflow as tf

    warnings.warn(
        "search.keras.set_threads is no longer needed: the framework sets TensorFlow's "
        "threads before the trainable runs",
        DeprecationWarning,
        stacklevel=2,
    )
    threads = max(1, int(ctx.num_threads))
    pools = tf.config.threading
    return (
        pools.get_intra_op_parallelism_threads()
        == pools.get_inter_op_parallelism_threads()
        == threads
    )


def fit(
    model: Any, ctx: TrialContext, *args: Any, callbacks: Sequence[Any] = (), **fit_kwargs: Any
) -> Generator[Metrics, None, Any]:
    """Runs ``model.fit(*args, **fit_kwargs)`` once over the trial's epochs, yielding each.

    ``fit`` gets ``epochs=ctx.max_epochs``, ``initial_epoch=ctx.start_epoch - 1``,
    ``verbose=0`` (unless given) and ``callbacks`` plus the adapter's own. After the last
    epoch it returns ``model``, so ``return (yield from fit(model, ctx, ...))`` hands the
    trained model to :func:`train_to_end`.

    Yields:
        Each epoch's Keras logs (``loss``, ``val_loss``, ...), every number a Python float.

    Raises:
        TypeError: When ``epochs`` or ``initial_epoch`` is given (the context sets them).
        ValueError: When ``ctx.restore_dir`` is set and the model is not built.
        Exception: Whatever ``model.fit`` raised, in the caller.
    """
    if clash := sorted({"epochs", "initial_epoch"} & fit_kwargs.keys()):
        raise TypeError(f"search.keras.fit sets {', '.join(clash)} from the trial's context")
    handoff = _Handoff(model, ctx, list(callbacks))
    if ctx.restore_dir:
        handoff.load_weights(Path(ctx.restore_dir))
    kwargs = {"verbose": 0, **fit_kwargs, "callbacks": handoff.callbacks()}
    kwargs.update(epochs=ctx.max_epochs, initial_epoch=ctx.start_epoch - 1)
    name = f"keras-fit-{ctx.trial_number}"
    yield from drive(handoff, lambda: model.fit(*args, **kwargs), name, handoff.stop)
    return model


class _Handoff(Handoff):
    """The fit thread's callbacks, saving each epoch's state before handing it out."""

    def __init__(self, model: Any, ctx: TrialContext, user_callbacks: list[Any]) -> None:
        super().__init__()
        self.model, self.ctx, self.user_callbacks = model, ctx, user_callbacks

    def callbacks(self) -> list[Any]:
        """The user's callbacks, then the hand-off (which sees their ``on_epoch_end`` done)."""
        from keras.callbacks import LambdaCallback

        last = LambdaCallback(
            on_train_begin=lambda logs=None: self._load_counters(),
            on_epoch_end=self._epoch_end,
        )
        return [*self.user_callbacks, last]

    def stop(self) -> None:
        """Stops ``fit`` after its current batch."""
        self.model.stop_training = True

    def _epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        metrics = {k: v for k, v in as_metrics(logs or {}).items() if isinstance(v, float)}
        if self.ctx.checkpoint_dir:
            self._save(epoch + 1, Path(self.ctx.checkpoint_dir))
        if not self.hand(metrics):
            self.model.stop_training = True

    def _save(self, epoch: int, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_weights(folder / WEIGHTS_FILE, overwrite=True)
        counters = [_counters(cb) for cb in self.user_callbacks]
        (folder / STATE_FILE).write_text(json.dumps({"epoch": epoch, "callbacks": counters}))

    def load_weights(self, folder: Path) -> None:
        """The model's weights and optimizer variables, as :meth:`_save` wrote them."""
        model = self.model
        if not model.built:
            raise ValueError(
                "search.keras.fit: a restored trial needs a built model "
                "(start it with keras.Input, or call model.build(input_shape))"
            )
        with model.distribute_strategy.scope():  # mirrored variables when it has replicas
            if not model.optimizer.built:  # its variables must exist to be loaded
                model.optimizer.build(model.trainable_variables)
            model.load_weights(folder / WEIGHTS_FILE)

    def _load_counters(self) -> None:
        """After the user's callbacks reset themselves in ``on_train_begin``."""
        if not self.ctx.restore_dir:
            return
        state = json.loads((Path(self.ctx.restore_dir) / STATE_FILE).read_text())
        for cb, counters in zip(self.user_callbacks, state["callbacks"], strict=False):
            for key, value in counters.items():
                setattr(cb, key, value)


def _counters(callback: Any) -> dict[str, int | float]:
    """The patience counters ``callback`` has (ints stay ints, for JSON)."""
    found = {k: getattr(callback, k, None) for k in _COUNTERS}
    return {
        k: v if isinstance(v, int) and not isinstance(v, bool) else number
        for k, v in found.items()
        if (number := as_number(v)) is not None
    }


def save_model(model: Any, out_dir: str | Path) -> Path:
    """Saves ``model`` as ``out_dir/model.keras`` (reload with ``keras.models.load_model``).

    A subclassed model needs ``get_config`` for this format (Keras raises otherwise).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save(out / MODEL_FILE)
    return out / MODEL_FILE


def save_onnx(
    model: Any,
    out_dir: str | Path,
    x: Any = None,
    labels: Any = None,
    **declare: Any,
) -> Metrics:
    """Writes ``out_dir/model.onnx`` (:func:`_to_onnx`), checks it against Keras with
    onnxruntime and declares it in ``inputs.json`` (input: the Keras input's name; output:
    ``output_0``).

    Args:
        model: A built Keras model with one input.
        x: Inputs as the model takes them (compared on, with 32 random rows uniform in
            [0, 1) of the model's input shape); with ``labels``, shipped as ``validation.npz``
            with Keras' accuracy on exactly those rows.
        declare: More fields of the input (``scale``, ``layout``, ``mean``, ``std``) and
            :func:`~search.write_inputs` keywords (``classes``).

    Returns:
        ``onnx_max_abs_diff`` and, with ``labels``, ``onnx_val_accuracy``.

    Raises:
        ValueError: When the model has several inputs, or ONNX Runtime's outputs differ from
            Keras' by more than :data:`ONNX_TOLERANCE`.
    """
    import numpy as np
    import onnxruntime as ort

    if len(model.inputs) != 1:
        raise ValueError(
            f"model.onnx: save_onnx takes a model with one input, not {len(model.inputs)}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _to_onnx(model, out / ONNX_FILE)
    session = ort.InferenceSession(str(out / ONNX_FILE), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    shape = tuple(int(d) for d in model.inputs[0].shape[1:])
    random = np.random.default_rng(0).random((32, *shape), dtype=np.float32)
    feeds = [random] + ([np.asarray(x, dtype=np.float32)] if x is not None else [])
    diff, scores, got = 0.0, np.empty(0), np.empty(0)
    for feed in feeds:
        got = session.run(None, {name: feed})[0]
        scores = np.asarray(model.predict(feed, verbose=0))
        diff = max(diff, float(np.abs(got - scores).max()))
    if not diff <= ONNX_TOLERANCE:
        raise ValueError(
            f"model.onnx: outputs differ from Keras' by {diff:.3g} (> {ONNX_TOLERANCE})"
        )
    found: Metrics = {"onnx_max_abs_diff": diff}
    keywords = {k: declare.pop(k) for k in ("classes",) if k in declare}
    (graph_in,) = graph_tensors(session.get_inputs())
    entry = {"shape": graph_in.shape, "dtype": graph_in.dtype, **declare}
    val: Any = None
    if x is not None and labels is not None:
        val = (feeds[-1], np.asarray(labels))
        keywords["validation_accuracy"] = float((scores.argmax(1) == val[1]).mean())
        found["onnx_val_accuracy"] = float((got.argmax(1) == val[1]).mean())
    write_inputs(
        out, {name: entry}, graph_tensors(session.get_outputs()), validation=val, **keywords
    )
    return found


@contextlib.contextmanager
def _quiet_tensorflow_logger() -> Iterator[None]:
    """TensorFlow's Python logger at ERROR for the block: the conversion's own calls of TF v1
    APIs (``convert_variables_to_constants is deprecated``) are not the user's to fix."""
    logger = logging.getLogger("tensorflow")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _to_onnx(model: Any, path: Path) -> None:
    """Converts ``model`` with tf2onnx from its frozen graph (Keras 3's ``model.export(...,
    format="onnx")`` leaves captured constants, e.g. a ``Normalization`` layer's statistics,
    as extra graph inputs), then names the input after Keras' and the output ``output_0``."""
    import tensorflow as tf
    import tf2onnx
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    name = str(model.inputs[0].name)
    spec = (tf.TensorSpec(model.inputs[0].shape, model.inputs[0].dtype, name="x"),)
    with _quiet_tensorflow_logger():  # tf2onnx calls TF v1 APIs: their deprecation notes
        frozen = convert_variables_to_constants_v2(
            tf.function(
                lambda x: model(x, training=False), input_signature=spec
            ).get_concrete_function()
        )
        proto, _ = tf2onnx.convert.from_graph_def(
            frozen.graph.as_graph_def(),
            input_names=[t.name for t in frozen.inputs],
            output_names=[t.name for t in frozen.outputs],
            opset=ONNX_OPSET,
        )
    renames = {proto.graph.input[0].name: name, proto.graph.output[0].name: "output_0"}
    for value in (*proto.graph.input, *proto.graph.output):
        value.name = renames.get(value.name, value.name)
    for node in proto.graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    path.write_bytes(proto.SerializeToString())


def train_and_save(
    train: TrainFn,
    config: Mapping[str, Any],
    data: Dataset,
    ctx: TrialContext,
    out_dir: Path,
    **declare: Any,
) -> Metrics:
    """An export hook in one call: :func:`train_to_end` with ``train``, then :func:`save_model`
    and :func:`save_onnx` (``declare`` is its: ``mean=``, ``std=``, ``scale=``, ``classes=``).

    A loader that standardizes the rows trains a model that takes standardized rows, and the
    served model takes what ``inputs.json`` declares: give ``mean=`` and ``std=`` here (then
    it takes raw rows and standardizes them), or put a ``keras.layers.Normalization`` adapted
    on the training rows inside the model. ``classes=`` names the answers.

    ``train`` must end with ``return (yield from fit(...))`` (:func:`fit` returns the model).
    ``model.onnx`` is compared with Keras on ``data``'s validation inputs when the model takes
    them as they are (float, the model's input shape; else on random inputs only) and shipped
    with them as ``validation.npz``. Returns the last epoch's metrics plus ``epochs``, the
    number of epochs trained, and :func:`save_onnx`'s (none for a model with several inputs).
    """
    trained = train_to_end(train, config, data, ctx)
    save_model(trained.model, out_dir)
    found = {**trained.metrics, "epochs": float(trained.epochs)}
    model = trained.model
    if len(model.inputs) != 1:
        return found
    x, y = (_array(data, name) for name in ("x_val", "y_val"))
    if x is None or y is None:  # a loader's own layout: compared on random inputs only
        return found | save_onnx(model, out_dir, **declare)
    fits = tuple(x.shape[1:]) == tuple(model.inputs[0].shape[1:]) and x.dtype.kind == "f"
    return found | save_onnx(model, out_dir, *((x, y) if fits and len(x) else ()), **declare)


def _array(data: Any, name: str) -> np.ndarray | None:
    """``data.name`` of a :class:`Dataset`, or ``data[name]`` of a loader's mapping."""
    found = data.get(name) if isinstance(data, Mapping) else getattr(data, name, None)
    return None if found is None else np.asarray(found)
