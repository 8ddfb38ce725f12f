"""The model MLflow serves for a bundle with ``model.onnx``: raw rows in, class names out.

MLflow stores this file with the registered version ("models from code": no pickle) and runs
it when the version is loaded (``mlflow.pyfunc.load_model``, ``mlflow models serve``); it
needs numpy, pandas, onnxruntime and MLflow, nothing of ``search``. Its artifacts are the
bundle's ``model.onnx`` (the raw graph, as the bundle holds it) and ``inputs.json``.

For each input, a raw row becomes the graph's input as ``(raw / scale - mean) / std``, each
step only when ``inputs.json`` declares it (what ``write_inputs(..., mean=, std=)`` wrote).
When the graph's first output holds one score per class (two dimensions, at least two
columns), the answer is a table, one row per input row:

- ``label``: the class name (``classes`` in ``inputs.json``), or the class number when the
  bundle names no classes;
- ``probability``: that class's probability;
- ``probabilities``: one probability per class, in the order of ``classes``;
- ``logits``: the first output's raw row, only when asked with ``params={"logits": True}``.

Probabilities are the softmax of the first output, unless its rows already sum to one (a
graph that ends in a softmax). A binary classifier with one output column (one logit, or one
probability after a sigmoid: the model config's ``one_column`` says which) whose bundle names
two classes is answered as a two-class model: the column becomes ``[0, z]`` or ``[1 - p,
p]`` (:mod:`search.handover.binary`, written again here). Any other graph answers its outputs
by name, as it computes them. This module is not imported by ``search``: MLflow runs it
(``set_model`` below).
"""

from __future__ import annotations

import json
from typing import Any

import mlflow
import numpy as np
import pandas as pd
from mlflow.pyfunc.model import PythonModel

LOGITS = "logits"
"""The ``params`` flag that adds the first output's raw row to each answer."""


def prepare(entry: dict[str, Any], raw: Any) -> np.ndarray:
    """Raw values as the graph takes them: ``(raw / scale - mean) / std``, each step only
    when ``entry`` (an input of ``inputs.json``) declares it, in its dtype (the same steps as
    ``search check``, written again here: this file imports nothing of ``search``)."""
    dtype = entry.get("dtype") or "float32"
    if not any(entry.get(k) is not None for k in ("scale", "mean", "std")):
        return np.asarray(raw, dtype=dtype)  # token ids and other integers stay exact
    x = np.asarray(raw, dtype=np.float64)
    if entry.get("scale"):
        x = x / entry["scale"]
    if entry.get("mean") is not None:
        x = x - np.asarray(entry["mean"])
    if entry.get("std") is not None:
        x = x / np.asarray(entry["std"])
    return x.astype(dtype)


def probabilities(scores: np.ndarray) -> np.ndarray:
    """The rows of ``scores`` as probabilities: kept when they already are, else softmax."""
    scores = scores.astype(np.float64)
    if (scores >= 0).all() and np.allclose(scores.sum(axis=1), 1.0, atol=1e-4):
        return scores
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def two_columns(scores: np.ndarray, kind: str) -> np.ndarray:
    """One column as two: ``[0, z]`` for logits, ``[1 - p, p]`` for probabilities."""
    column = np.asarray(scores, dtype=np.float64).reshape(-1, 1)
    other = 1.0 - column if kind == "probability" else np.zeros_like(column)
    return np.hstack([other, column])


class LabelledOnnx(PythonModel):  # type: ignore[misc]  # untyped base
    """``model.onnx`` behind the preprocessing and the labels of ``inputs.json``."""

    def load_context(self, context: Any) -> None:
        """Opens the graph and reads ``inputs.json`` (when the bundle had one)."""
        import onnxruntime as ort

        self.session = ort.InferenceSession(
            context.artifacts["model"], providers=["CPUExecutionProvider"]
        )
        declared: dict[str, Any] = {}
        if "inputs" in context.artifacts:
            with open(context.artifacts["inputs"]) as file:
                declared = json.load(file)
        graph = [{"name": i.name, "dtype": "float32"} for i in self.session.get_inputs()]
        self.inputs = declared.get("inputs") or graph
        self.classes = declared.get("classes")
        self.names = [o.name for o in self.session.get_outputs()]
        self.one_column = (getattr(context, "model_config", None) or {}).get("one_column")

    def _arrays(self, model_input: Any) -> dict[str, Any]:
        """The raw arrays by input name."""
        if isinstance(model_input, dict):
            return model_input
        if isinstance(model_input, pd.DataFrame):
            model_input = model_input.to_numpy()
        return {self.inputs[0]["name"]: model_input}

    def predict(
        self, context: Any, model_input: np.ndarray, params: dict[str, Any] | None = None
    ) -> Any:
        """The answer for raw rows (module docstring).

        ``model_input`` is a dict of arrays by input name, an array or a table (the
        annotation is one MLflow draws no schema from: the logged signature is the schema;
        without one, or with another, MLflow warns on every load)."""
        arrays = self._arrays(model_input)
        feed = {t["name"]: prepare(t, arrays[t["name"]]) for t in self.inputs}
        outputs = self.session.run(None, feed)
        scores = raw_scores = np.asarray(outputs[0])
        single = scores.ndim == 1 or (scores.ndim == 2 and scores.shape[1] == 1)
        if single and self.one_column and self.classes and len(self.classes) == 2:
            scores = two_columns(scores, self.one_column)
        if scores.ndim != 2 or scores.shape[1] < 2:
            return dict(zip(self.names, outputs, strict=False))
        probs = probabilities(scores)
        best = probs.argmax(axis=1)
        labels = [self.classes[i] for i in best] if self.classes else best.tolist()
        answer = pd.DataFrame(
            {
                "label": labels,
                "probability": probs[np.arange(len(best)), best],
                "probabilities": probs.tolist(),
            }
        )
        if (params or {}).get(LOGITS):
            answer[LOGITS] = raw_scores.reshape(len(best), -1).tolist()
        return answer


mlflow.models.set_model(LabelledOnnx())
