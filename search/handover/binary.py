"""A binary classifier with one output column (one logit, or one probability after a
sigmoid), as ``BCEWithLogitsLoss`` models and Keras' ``Dense(1, activation="sigmoid")`` are
written: scored and served as a two-class model when its bundle names two classes.

The column becomes two, ``[0, z]`` for a logit ``z`` (their softmax is ``[1 - sigmoid(z),
sigmoid(z)]``) or ``[1 - p, p]`` for a probability ``p``, so the rest (argmax, softmax, the
label) is the two-class path. Which one the column holds is read from the graph: the node
that writes the first output is a ``Sigmoid`` (a probability) or not (a logit). The served
model (:mod:`search.handover.served_model`, which imports nothing of ``search``) writes
:func:`two_columns` again and is told the kind at registration.

Example:
    >>> import numpy as np
    >>> two_columns(np.array([[-2.0], [3.0]]), LOGIT).argmax(axis=1).tolist()
    [0, 1]
    >>> two_columns(np.array([0.2, 0.9]), PROBABILITY).round(2).tolist()
    [[0.8, 0.2], [0.1, 0.9]]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

LOGIT = "logit"
PROBABILITY = "probability"


def one_column(scores: np.ndarray, classes: Sequence[str] | None) -> bool:
    """Whether ``scores`` is one value a row (shape ``(n,)`` or ``(n, 1)``) of a model whose
    bundle names two classes."""
    single = scores.ndim == 1 or (scores.ndim == 2 and scores.shape[1] == 1)
    return single and classes is not None and len(classes) == 2


def kind_of(onnx_file: Path) -> str:
    """:data:`PROBABILITY` when a ``Sigmoid`` node writes the graph's first output, else
    :data:`LOGIT` (also when the ``onnx`` package is missing)."""
    try:
        import onnx
    except ImportError:
        return LOGIT
    graph = onnx.load(str(onnx_file), load_external_data=False).graph
    first = graph.output[0].name
    writers = [node.op_type for node in graph.node if first in node.output]
    return PROBABILITY if writers == ["Sigmoid"] else LOGIT


def two_columns(scores: np.ndarray, kind: str) -> np.ndarray:
    """One column as two: ``[0, z]`` for logits, ``[1 - p, p]`` for probabilities."""
    column = np.asarray(scores, dtype=np.float64).reshape(-1, 1)
    other = 1.0 - column if kind == PROBABILITY else np.zeros_like(column)
    return np.hstack([other, column])
