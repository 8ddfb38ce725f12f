"""The bundle's model as an MLflow 3 logged model: raw rows in, class names out, pickle-free.

A bundle with ``model.onnx`` is logged as a Python model from code
(:mod:`search.handover.served_model`, stored as a file, no pickle) whose artifacts are the
graph and ``inputs.json``: it standardizes raw rows with the declared ``scale``, ``mean``
and ``std`` and answers the class name and the probabilities (the logits when asked with
``params={"logits": True}``). The raw graph stays in the model's artifacts and in the run's
``bundle/``. A TensorFlow bundle without ONNX is logged with ``mlflow.tensorflow`` from its
``model.keras`` (Keras' zip format: JSON and weights, no pickle), taking the model's input.

The signature comes from ``inputs.json`` (:mod:`search.contract.inputs`) or, without it or
when it names other inputs than the graph takes, from the ONNX graph. The input example is
the first rows of the bundle's validation data as a caller sends them (raw: the shipped
arrays with the declared standardization undone), zeros of the declared shapes when the
bundle ships none (a Keras model's example: the shipped rows as it takes them).
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from search.contract.inputs import INPUTS_FILE, Declared, Tensor, onnx_tensors
from search.errors import SearchError
from search.handover import binary, check

if TYPE_CHECKING:
    from collections.abc import Sequence

MODEL_NAME = "model"
"""The logged model's name in its run."""
EXAMPLE_BATCH = 2
OTHER_DYNAMIC = 8
EXAMPLE_ROWS = 5
"""Validation rows in the input example."""
SERVED_CODE = Path(__file__).with_name("served_model.py")
"""The code MLflow stores and runs for an ONNX bundle."""
LOGITS = "logits"
"""The served model's parameter that adds the logits to its answer (its own copy:
:data:`search.handover.served_model.LOGITS`)."""
SERVED_PACKAGES = ("mlflow", "numpy", "pandas", "onnxruntime")
"""What the served model imports: its requirements, pinned to this machine's versions."""


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
    """The MLflow signature and input example (zeros) of these tensors."""
    from mlflow.models import ModelSignature

    sig = ModelSignature(inputs=_schema(inputs), outputs=_schema(outputs) if outputs else None)
    return sig, example(inputs)


def raw(t: Tensor, prepared: np.ndarray) -> np.ndarray:
    """Rows as the model takes them turned back into raw rows: ``(x * std + mean) * scale``,
    each step only when ``t`` declares it (the inverse of :func:`search.handover.check.prepared`
    and of what the served model does)."""
    x = np.asarray(prepared, dtype=np.float64)
    if t.std is not None:
        x = x * np.asarray(t.std)
    if t.mean is not None:
        x = x + np.asarray(t.mean)
    if t.scale:
        x = x * t.scale
    return x.astype(np.dtype(t.dtype))


def _shipped(folder: Path, declared: Declared | None) -> dict[str, np.ndarray] | None:
    """The first validation rows as the model takes them; None when the bundle has none."""
    if declared is None:
        return None
    try:
        got = check.validation_rows(folder, declared, declared.inputs, builtin=True)
    except SearchError:  # unreadable: ``check`` says why; the example falls back to zeros
        return None
    return None if isinstance(got, str) else {k: v[:EXAMPLE_ROWS] for k, v in got[0].items()}


def _example(folder: Path, declared: Declared | None, inputs: Sequence[Tensor]) -> Any:
    """The first validation rows, raw, or zeros when the bundle ships none."""
    rows = _shipped(folder, declared)
    if rows is None or declared is None:
        return example(inputs)
    by_name = {t.name: t for t in declared.inputs}
    return {k: raw(by_name[k], v) for k, v in rows.items() if k in by_name}


def _served_signature(inputs: Sequence[Tensor]) -> Any:
    """Raw inputs of the declared shapes; a label, its probability, every probability (and
    the logits when asked) out; the ``logits`` flag as a parameter."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, ParamSchema, ParamSpec, Schema
    from mlflow.types.schema import Array

    outputs = Schema(
        [
            ColSpec(DataType.string, "label"),
            ColSpec(DataType.double, "probability"),
            ColSpec(Array(DataType.double), "probabilities"),
            ColSpec(Array(DataType.double), LOGITS, required=False),
        ]
    )
    params = ParamSchema([ParamSpec(LOGITS, DataType.boolean, False)])
    return ModelSignature(inputs=_schema(inputs), outputs=outputs, params=params)


def log_model(folder: Path, declared: Declared | None) -> Any:
    """Logs the bundle's model in the active run; returns MLflow's ``ModelInfo``.

    Raises:
        SearchError: When the bundle has neither ``model.onnx`` nor ``model.keras``.
    """
    onnx_file = folder / (
        declared.model if declared and declared.model.endswith(".onnx") else "model.onnx"
    )
    if onnx_file.is_file():
        return _log_onnx(folder, onnx_file, declared)
    keras_file = folder / "model.keras"
    if keras_file.is_file():
        return _log_keras(keras_file, declared)
    raise SearchError(
        f"{folder}: no model.onnx or model.keras to register; the export hook must write one"
    )


def _log_onnx(folder: Path, onnx_file: Path, declared: Declared | None) -> Any:
    """The served model (:mod:`search.handover.served_model`) around ``onnx_file``."""
    import mlflow.pyfunc

    inputs, _ = onnx_tensors(onnx_file)
    if declared and declared.model.endswith(".onnx") and _same_names(declared.inputs, inputs):
        inputs = declared.inputs
    else:
        declared = None  # it describes another file: the graph alone says what it takes
    artifacts = {"model": str(onnx_file)}
    if declared is not None:
        artifacts["inputs"] = str(folder / INPUTS_FILE)
    return mlflow.pyfunc.log_model(
        name=MODEL_NAME,
        python_model=str(SERVED_CODE),
        artifacts=artifacts,
        signature=_served_signature(inputs),
        input_example=_example(folder, declared, inputs),
        pip_requirements=[f"{p}=={version(p)}" for p in SERVED_PACKAGES],
        model_config={"one_column": binary.kind_of(onnx_file)},  # read for one column only
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
        examples = _shipped(path.parent, declared) or examples  # its input, as it takes it
        example = next(iter(examples.values())) if len(examples) == 1 else examples
    return mlflow.tensorflow.log_model(model, name=MODEL_NAME, signature=sig, input_example=example)
