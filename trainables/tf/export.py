"""The export hook every TensorFlow trainable shares: train to the end, save, reload, check.

The twin of ``trainables.torch.export``. ``train.exporter(make_exporter(train))`` next to a
trainable's ``train`` gives it the hook of :mod:`search.contract`. The hook trains exactly as
``train`` does (same config, seed, data; the model and its datasets are what the generator
returns, ``(model, splits)`` from :func:`trainables.tf.loop.fit_epochs`), then writes into
``out_dir``:

    model.keras    the trained model; reload it with ``keras.models.load_model``
    saved_model/   ``model.export``: a TF SavedModel whose ``serve`` signature takes NHWC
                   float32 images divided by ``input_scale`` (the training split's largest
                   value: 16 for the digits, 255 for most image folders) and returns class
                   probabilities
    model.onnx     the same model for onnxruntime (:func:`search.keras.save_onnx`), checked
                   against Keras on random inputs and the validation split
    inputs.json    ``model.onnx``'s input and output (:func:`search.write_inputs`): names
                   (the SavedModel's signature has the same), shapes, dtypes, NHWC and the
                   ``scale`` the raw data is divided by; ``validation.npz`` is the validation
                   split as the model takes it, with Keras' accuracy on it

and scores the reloaded ``model.keras`` on the validation split.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras

from search import Dataset, ExportFn, Metrics, TrainFn, TrialContext, train_to_end
from trainables.tf.data import pipeline


def export_keras(
    train: TrainFn, config: Mapping[str, Any], data: Dataset, ctx: TrialContext, out_dir: Path
) -> Metrics:
    """Trains ``config`` with the trainable ``train`` to its end, then saves the model.

    Returns:
        The last epoch's metrics and ``epochs``, plus ``export_val_loss`` and
        ``export_val_accuracy`` (the reloaded file on the validation split) and
        ``input_scale``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trained = train_to_end(train, config, data, ctx)
    last, epochs = trained.metrics, trained.epochs
    model, splits = trained.model
    model.save(out / "model.keras")
    model.export(str(out / "saved_model"), format="tf_saved_model", verbose=False)
    import numpy as np

    from search.keras import save_onnx

    batches = list(splits.val.batch(1024).as_numpy_iterator())
    x_val, y_val = (np.concatenate([b[i] for b in batches]) for i in (0, 1))
    layout = "NHWC" if x_val.ndim == 4 else None
    onnx = save_onnx(model, out, x_val, y_val, scale=splits.scale, layout=layout)
    reloaded = keras.models.load_model(out / "model.keras")
    val = pipeline(splits.val, int(config.get("batch_size", 64)), ctx.num_threads)
    val_loss, val_accuracy = reloaded.evaluate(val, verbose=0)
    return {
        **last,
        "epochs": float(epochs),
        "export_val_loss": float(val_loss),
        "export_val_accuracy": float(val_accuracy),
        "input_scale": float(splits.scale),
        **onnx,
    }


def make_exporter(train: TrainFn) -> ExportFn:
    """The export hook (:mod:`search.contract`) of the TensorFlow trainable ``train``."""

    def export(
        config: Mapping[str, Any], data: Dataset, ctx: TrialContext, out_dir: Path
    ) -> Metrics:
        return export_keras(train, config, data, ctx, out_dir)

    export.__doc__ = f"Export hook of ``{train.__module__}``: see :mod:`trainables.tf.export`."
    return export
