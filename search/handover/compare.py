"""``model.onnx`` against the framework's own file, for a user's export hook (step 4 of
``export``; the built-in hooks compare inside themselves).

When the hook wrote ``model.onnx`` beside ``model.keras`` and did not report
``onnx_max_abs_diff`` itself, export reloads ``model.keras`` (``keras.models.load_model``:
the file the user ships, not the object the hook held) and runs both on the same inputs: the
rows of the bundle's ``validation.npz`` when ``inputs.json`` names one, and 32 random rows of
the declared (or graph) input shape, uniform in [0, 1). The largest absolute difference of the
first output goes into ``metrics.json``'s ``final`` (and so the card), with
``onnx_val_accuracy`` when the validation rows have labels.

A PyTorch ``model.safetensors`` holds weights without the module that runs them, so it is not
compared here: a hook can report ``onnx_max_abs_diff`` itself (as the built-ins do).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from search.contract.inputs import LABELS, read_inputs
from search.errors import one_line

TOLERANCE = 1e-4
"""The largest absolute difference a log line does not warn about."""
RANDOM_ROWS = 32


def _inputs(folder: Path, session: Any) -> tuple[list[Any], Any]:
    """The input batches to compare on (random, then the shipped validation rows) and the
    labels of the last, or None."""
    import numpy as np

    declared = read_inputs(folder)
    arg = session.get_inputs()[0]
    dims = [d if isinstance(d, int) else 1 for d in (arg.shape or [])[1:]]
    if declared is not None and declared.inputs[0].name == arg.name:
        dims = [d if isinstance(d, int) else 1 for d in declared.inputs[0].shape[1:]]
    batches = [np.random.default_rng(0).random((RANDOM_ROWS, *dims), dtype=np.float32)]
    labels = None
    npz = folder / (declared.validation or "") if declared is not None else None
    if npz is not None and npz.suffix == ".npz" and npz.is_file():
        with np.load(npz, allow_pickle=False) as found:
            if arg.name in found.files:
                batches.append(np.asarray(found[arg.name], dtype=np.float32))
                labels = np.asarray(found[LABELS]) if LABELS in found.files else None
    return batches, labels


def onnx_against_keras(folder: Path) -> dict[str, float]:
    """``onnx_max_abs_diff`` (and ``onnx_val_accuracy``) of ``folder``'s ``model.onnx``
    against its ``model.keras``; {} when the folder lacks either or the model has several
    inputs.

    Raises:
        ValueError: One line, when either model cannot be run on the inputs.
    """
    if not (folder / "model.onnx").is_file() or not (folder / "model.keras").is_file():
        return {}
    import keras
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    if len(session.get_inputs()) != 1:
        return {}
    model = keras.models.load_model(folder / "model.keras")
    batches, labels = _inputs(folder, session)
    diff, found = 0.0, {}
    try:
        for batch in batches:
            got = np.asarray(session.run(None, {session.get_inputs()[0].name: batch})[0])
            expected = np.asarray(model.predict(batch, verbose=0))
            diff = max(diff, float(np.abs(got - expected).max()))
    except Exception as exc:  # onnxruntime's and Keras' own exceptions
        raise ValueError(f"model.onnx vs model.keras: {one_line(exc, limit=300)}") from None
    found["onnx_max_abs_diff"] = diff
    if labels is not None and got.ndim == 2 and got.shape[1] > 1:
        found["onnx_val_accuracy"] = float((got.argmax(1) == labels).mean())
    return found
