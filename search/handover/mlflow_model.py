"""The bundle's model as an MLflow 3 logged model: pickle-free, with a signature and an example.

``model.onnx`` is logged with ``mlflow.onnx``; a TensorFlow bundle without ONNX with
``mlflow.tensorflow`` from its ``model.keras`` (Keras' zip format: JSON and weights, no
pickle). The signature and the input example come from ``inputs.json``
(:mod:`search.contract.inputs`); without it, or when it names other inputs than the graph
takes, from the ONNX graph.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from search.contract.inputs import Declared, Tensor, onnx_tensors
from search.errors import SearchError

if TYPE_CHECKING:
    from collections.abc import Sequence

MODEL_NAME = "model"
"""The logged model's name in its run."""
EXAMPLE_BATCH = 2
OTHER_DYNAMIC = 8


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else -1 for d in t.shape)


def _schema(tensors: Sequence[Tensor]) -> Any:
    from mlflow.types import Schema, TensorSpec

    return Schema([TensorSpec(np.dtype(t.dtype), _shape(t), t.name) for t in tensors])


def example(inputs: Sequence[Tensor]) -> dict[str, np.ndarray]:
    """Zeros of each declared input's shape (batch 2, any other dynamic dimension 8)."""
    found = {}
    for t in inputs:
        dims = [
            d if isinstance(d, int) else (EXAMPLE_BATCH if i == 0 else OTHER_DYNAMIC)
            for i, d in enumerate(t.shape)
        ]
        found[t.name] = np.zeros(dims, dtype=np.dtype(t.dtype))
    return found


def signature(
    inputs: Sequence[Tensor], outputs: Sequence[Tensor]
) -> tuple[Any, dict[str, np.ndarray]]:
    """The MLflow signature and input example of these tensors."""
    from mlflow.models import ModelSignature

    sig = ModelSignature(inputs=_schema(inputs), outputs=_schema(outputs) if outputs else None)
    return sig, example(inputs)


def log_model(folder: Path, declared: Declared | None) -> Any:
    """Logs the bundle's model in the active run; returns MLflow's ``ModelInfo``.

    Raises:
        SearchError: When the bundle has neither ``model.onnx`` nor ``model.keras``.
    """
    onnx_file = folder / (
        declared.model if declared and declared.model.endswith(".onnx") else "model.onnx"
    )
    if onnx_file.is_file():
        import mlflow.onnx
        import onnx

        inputs, outputs = onnx_tensors(onnx_file)
        if declared and declared.model.endswith(".onnx") and _same_names(declared.inputs, inputs):
            inputs, outputs = declared.inputs, declared.outputs or outputs
        sig, ex = signature(inputs, outputs)
        return mlflow.onnx.log_model(
            onnx.load(str(onnx_file)), name=MODEL_NAME, signature=sig, input_example=ex
        )
    keras_file = folder / "model.keras"
    if keras_file.is_file():
        return _log_keras(keras_file, declared)
    raise SearchError(
        f"{folder}: no model.onnx or model.keras to register; the export hook must write one"
    )


def _same_names(declared: Sequence[Tensor], graph: Sequence[Tensor]) -> bool:
    """Whether ``inputs.json`` names the graph's inputs: otherwise its signature would make
    the served model refuse every request, so the graph's own tensors give it."""
    return sorted(t.name for t in declared) == sorted(t.name for t in graph)


def _log_keras(path: Path, declared: Declared | None) -> Any:
    """The Keras model with TensorFlow's flavor (saved in Keras' own format)."""
    import keras
    import mlflow.tensorflow

    model = keras.models.load_model(path)
    sig, example = None, None
    if declared is not None:
        sig, examples = signature(declared.inputs, declared.outputs)
        example = next(iter(examples.values())) if len(examples) == 1 else examples
    return mlflow.tensorflow.log_model(model, name=MODEL_NAME, signature=sig, input_example=example)
