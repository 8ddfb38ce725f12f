"""What an exported model takes: ``inputs.json``, written by an export hook in one call.

An export hook (:mod:`search.contract.registry`) writes its model files into ``out_dir``;
beside them it should declare the model's inputs, so that ``MODEL_CARD.md`` describes them
and ``python -m search check`` can run ``model.onnx`` from any folder without importing the
trainable's package::

    from search import write_inputs

    write_inputs(out_dir, {"x": x_val[:2]})                  # names, shapes, dtypes of arrays
    write_inputs(out_dir, out_dir / "model.onnx")            # or read from the ONNX graph
    write_inputs(out_dir, {"x": x_val[:2]}, validation=(x_val, y_val))  # and check accuracy

The file (one JSON object)::

    {
      "model": "model.onnx",
      "inputs": [{"name": "x", "shape": [null, 30], "dtype": "float32"}],
      "outputs": [{"name": "logits", "shape": [null, 2], "dtype": "float32",
                   "note": "argmax is the class"}],
      "validation": "validation.npz",
      "validation_accuracy": 0.8545,
      "classes": ["benign", "malignant"]
    }

Each input or output has a ``name``, a ``shape`` (ints; ``null`` for the batch dimension and
any other dynamic one, or a string naming a dynamic dimension) and a ``dtype`` (numpy's name:
``float32``, ``int64``...), and optionally ``layout`` (``"NCHW"``, ``"NHWC"``...), ``scale``
(feed the data's raw values divided by this number), ``mean`` and ``std`` (then subtract
``mean`` and divide by ``std``: a number, or nested lists that broadcast against one example,
e.g. one value per feature of a ``[None, 30]`` input) and ``note`` (free text for the card).
A server turns a raw row into the model's input as ``(raw / scale - mean) / std`` (each step
only when declared); the built-in trainables keep their scaling inside ``model.onnx`` and
declare none. ``classes`` (optional) names the classes in the order of the first output's
columns: its argmax indexes them.

``model`` is the file described (default ``model.onnx``). ``validation`` (optional) names
data the check may score the model on, comparing its accuracy with ``metrics.json``:

- ``"dataset"``: the validation split of the bundle's ``config.yaml`` data (digits, or the
  image folder where it exists), as :class:`~search.contract.Dataset` holds it (divided by
  the input's ``scale`` when one is given), into the only input; the first output's argmax
  is the class;
- a file name in the bundle: an ``.npz`` holding one array per input name (as the model
  takes it: already scaled and normalized) and ``labels`` (``write_inputs(..., validation=(x,
  labels))`` writes ``validation.npz``).

``validation_accuracy`` (optional) is the framework model's accuracy on exactly the rows of
that ``.npz``: the check compares the ONNX model with it rather than with ``metrics.json``,
whose figure covers the whole split (a shipped subset scores differently).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from search.errors import SearchError

INPUTS_FILE = "inputs.json"
"""The file name, in the bundle folder."""
VALIDATION_FILE = "validation.npz"
"""Where :func:`write_inputs` saves validation arrays given to it."""
DATASET = "dataset"
"""``validation`` value: the validation split of the bundle's ``config.yaml`` data."""
LABELS = "labels"
"""The labels' key in a validation ``.npz``."""

Dim = int | str | None

_ONNX_TYPES = {
    "float": "float32",
    "double": "float64",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "bool": "bool",
    "string": "str",
}


class InputsError(SearchError, ValueError):
    """``inputs.json`` (or what a hook passed to :func:`write_inputs`) is malformed."""


def dtype_name(dtype: Any) -> str:
    """numpy's name for a numpy, PyTorch, TensorFlow, Keras or ONNX Runtime dtype.

    Example:
        >>> dtype_name("tensor(float)"), dtype_name("float32"), dtype_name("torch.int64")
        ('float32', 'float32', 'int64')
    """
    text = str(dtype)
    if text.startswith("tensor(") and text.endswith(")"):
        inner = text[len("tensor(") : -1]
        return _ONNX_TYPES.get(inner, inner)
    if text.startswith("torch."):
        return text.removeprefix("torch.")
    name = getattr(dtype, "name", None)
    if isinstance(name, str) and name:
        return name  # numpy and TensorFlow dtypes
    try:
        import numpy as np

        return str(np.dtype(dtype).name)
    except TypeError:
        return text


def shape_text(shape: Sequence[Dim]) -> str:
    """``[None, 30]``: a declared shape as the card and the check print it.

    Example:
        >>> shape_text([None, "seq", 8])
        '[None, seq, 8]'
    """
    return "[" + ", ".join("None" if d is None else str(d) for d in shape) + "]"


@dataclass(frozen=True)
class Tensor:
    """One declared input or output."""

    name: str
    shape: tuple[Dim, ...]
    dtype: str
    layout: str | None = None
    scale: float | None = None
    note: str | None = None
    mean: Any = None
    std: Any = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON entry (optional fields only when set)."""
        entry: dict[str, Any] = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        for key in ("layout", "scale", "mean", "std", "note"):
            if getattr(self, key) is not None:
                entry[key] = getattr(self, key)
        return entry

    def text(self, mark: str = "`") -> str:
        """``x: float32 [None, 30]`` (names and shapes between ``mark``), with its layout,
        scale and note when declared."""
        parts = [f"{mark}{self.name}{mark}: {self.dtype} {mark}{shape_text(self.shape)}{mark}"]
        if self.layout:
            parts.append(self.layout)
        if self.scale is not None:
            parts.append(f"divide the data's raw values by {self.scale:g}")
        if self.mean is not None or self.std is not None:
            parts.append("then subtract mean and divide by std (inputs.json)")
        if self.note:
            parts.append(self.note)
        return ", ".join(parts)


@dataclass(frozen=True)
class Declared:
    """The contents of ``inputs.json``."""

    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...] = ()
    model: str = "model.onnx"
    validation: str | None = None
    validation_accuracy: float | None = None
    classes: tuple[str, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "model": self.model,
            "inputs": [t.as_dict() for t in self.inputs],
            "outputs": [t.as_dict() for t in self.outputs],
        }
        for key in ("validation", "validation_accuracy"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        if self.classes is not None:
            data["classes"] = list(self.classes)
        return data


_FIELDS = ("layout", "scale", "mean", "std", "note")
"""The optional fields of an input or output."""


def _stats(value: Any, where: str, key: str) -> Any:
    """``mean`` or ``std`` as JSON (a float or nested lists of floats), checked finite (and
    non-zero for ``std``); None stays None."""
    if value is None:
        return None
    import numpy as np

    try:
        array = np.asarray(_numpy(value), dtype=np.float64)
    except (TypeError, ValueError):
        raise InputsError(f"{where}: {key} must be a number or a list of numbers") from None
    if not np.isfinite(array).all() or (key == "std" and (array == 0).any()):
        raise InputsError(f"{where}: {key} must be finite{' and non-zero' if key == 'std' else ''}")
    return array.tolist()


def _classes(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if hasattr(value, "tolist"):  # a numpy array of names
        value = value.tolist()
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise InputsError(f"{where}: classes must be a list of names, got {type(value).__name__}")
    return tuple(str(c) for c in value)


def _accuracy(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise InputsError(f"{where}: validation_accuracy must be a number in [0, 1], got {value!r}")
    return float(value)


def _dim(value: Any, where: str) -> Dim:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise InputsError(f"{where}: a dimension must be an int, null or a name, got {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise InputsError(
            f"{where}: a dimension must be an int, null or a name, got {value!r}"
        ) from None
    if number != value or number < 0:
        raise InputsError(f"{where}: a dimension must be a whole number >= 0, got {value!r}")
    return number


def _scale(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputsError(f"{where}: scale must be a number, got {value!r}")
    if not math.isfinite(value) or value == 0:
        raise InputsError(f"{where}: scale must be finite and non-zero, got {value!r}")
    return float(value)


def tensor(
    name: str,
    value: Any,
    dtype: Any = None,
    *,
    layout: str | None = None,
    scale: float | None = None,
    note: str | None = None,
    batch: bool = True,
    mean: Any = None,
    std: Any = None,
) -> Tensor:
    """One input or output, described from an example or a shape.

    Args:
        name: The name the model file gives it (the ONNX input name, the signature's key).
        value: An example batch (anything with ``shape`` and ``dtype``: numpy, PyTorch,
            TensorFlow, Keras tensors; with ``batch`` its first dimension becomes None), a
            shape (a sequence of ints, None or dimension names, taken as it is), or a mapping
            with ``shape``, ``dtype`` and optionally ``layout``, ``scale``, ``mean``, ``std``,
            ``note``.
        dtype: Overrides the example's dtype; a shape's default is float32.
        layout, scale, note: Optional notes for the card (module docstring).
        mean, std: The normalization a server applies after ``scale`` (module docstring).
        batch: Whether an example's first dimension is the batch (made None).

    Raises:
        InputsError: On a malformed name, shape, dtype or scale.
    """
    where = f"{INPUTS_FILE}: {name!r}"
    if not isinstance(name, str) or not name:
        raise InputsError(f"{INPUTS_FILE}: a name must be a non-empty string, got {name!r}")
    if isinstance(value, Mapping):
        extra = {k: value[k] for k in _FIELDS if value.get(k) is not None}
        unknown = set(value) - {"name", "shape", "dtype", *_FIELDS}
        if unknown:
            raise InputsError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        if "shape" not in value:
            raise InputsError(f"{where}: missing field 'shape'")
        return tensor(
            name,
            value["shape"],
            value.get("dtype", dtype),
            layout=extra.get("layout", layout),
            scale=extra.get("scale", scale),
            note=extra.get("note", note),
            batch=False,
            mean=extra.get("mean", mean),
            std=extra.get("std", std),
        )
    raw_shape = getattr(value, "shape", None)
    if raw_shape is not None and hasattr(value, "dtype"):
        dims: list[Any] = [None if d is None else int(d) for d in tuple(raw_shape)]
        if batch and dims:
            dims[0] = None
        dtype = value.dtype if dtype is None else dtype
    elif isinstance(value, Sequence) and not isinstance(value, str | bytes):
        dims = list(value)
    else:
        raise InputsError(
            f"{where}: expected an example array, a shape or a mapping, got {type(value).__name__}"
        )
    for key, text in (("layout", layout), ("note", note)):
        if text is not None and not isinstance(text, str):
            raise InputsError(f"{where}: {key} must be a string, got {text!r}")
    return Tensor(
        name,
        tuple(_dim(d, f"{where}: shape") for d in dims),
        dtype_name("float32" if dtype is None else dtype),
        layout,
        _scale(scale, where),
        note,
        _stats(mean, where, "mean"),
        _stats(std, where, "std"),
    )


def _tensors(value: Any, what: str) -> tuple[Tensor, ...]:
    if isinstance(value, Tensor):
        return (value,)
    if isinstance(value, Mapping):
        return tuple(v if isinstance(v, Tensor) else tensor(k, v) for k, v in value.items())
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        found: list[Tensor] = []
        for entry in value:
            if isinstance(entry, Tensor):
                found.append(entry)
            elif isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
                found.append(tensor(entry["name"], entry))
            else:
                raise InputsError(f"{INPUTS_FILE}: {what}: each entry needs a 'name'")
        return tuple(found)
    raise InputsError(
        f"{INPUTS_FILE}: {what}: expected a mapping of name to example or a list of entries, "
        f"got {type(value).__name__}"
    )


def onnx_tensors(path: str | os.PathLike[str]) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """``(inputs, outputs)`` of an ONNX file as its graph declares them (onnxruntime reads
    it); the first dimension, when dynamic, becomes None."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return graph_tensors(session.get_inputs()), graph_tensors(session.get_outputs())


def graph_tensors(args: Sequence[Any]) -> tuple[Tensor, ...]:
    """onnxruntime's ``NodeArg``s (``session.get_inputs()``) as :class:`Tensor`s; a dynamic
    first dimension (the batch) becomes None, other dynamic ones keep their names."""
    found = []
    for arg in args:
        dims: list[Dim] = [d if isinstance(d, int) else d or None for d in arg.shape or ()]
        if dims and not isinstance(dims[0], int):
            dims[0] = None
        found.append(Tensor(arg.name, tuple(dims), dtype_name(arg.type)))
    return tuple(found)


def write_inputs(
    out_dir: str | os.PathLike[str],
    inputs: Any,
    outputs: Any = None,
    *,
    model: str = "model.onnx",
    validation: Any = None,
    validation_accuracy: float | None = None,
    classes: Sequence[Any] | None = None,
    mean: Any = None,
    std: Any = None,
) -> Path:
    """Writes ``out_dir/inputs.json``: one call from an export hook.

    Args:
        out_dir: The bundle folder (the hook's ``out_dir``).
        inputs: A path to an ONNX file (its graph's inputs, and outputs unless given), a
            mapping of input name to an example batch, a shape or a mapping of fields
            (:func:`tensor`), or a list of entries with ``name``.
        outputs: The same for the outputs (optional).
        model: The model file described, relative to ``out_dir``.
        validation: ``"dataset"``, the name of an ``.npz`` already in ``out_dir``, or
            ``(x, labels)`` (``x`` an array for the only input, or a mapping of input name to
            array) saved as ``validation.npz``.
        validation_accuracy: The framework model's accuracy on exactly those validation rows
            (the check compares with it; give it when they are a subset of the split).
        classes: The class names, in the order of the first output's columns.
        mean: The only input's mean after ``scale`` (per input: a mapping entry's ``mean``).
        std: The only input's standard deviation after ``scale`` (per input: a mapping
            entry's ``std``).

    Returns:
        The path of ``inputs.json``.

    Raises:
        InputsError: On a malformed description.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(inputs, str | os.PathLike):
        graph_in, graph_out = onnx_tensors(inputs)
        declared_in = graph_in
        declared_out = graph_out if outputs is None else _tensors(outputs, "outputs")
        model = Path(inputs).name if Path(inputs).parent.resolve() == out.resolve() else model
    else:
        declared_in = _tensors(inputs, "inputs")
        declared_out = () if outputs is None else _tensors(outputs, "outputs")
    if not declared_in:
        raise InputsError(f"{INPUTS_FILE}: declare at least one input")
    names = [t.name for t in declared_in]
    if len(set(names)) != len(names):
        raise InputsError(f"{INPUTS_FILE}: input names repeat: {', '.join(names)}")
    if mean is not None or std is not None:
        declared_in = _normalized(declared_in, mean, std)
    source: str | None
    if validation is None or isinstance(validation, str):
        source = validation
    elif isinstance(validation, tuple) and len(validation) == 2:
        source = _save_validation(out, declared_in, *validation)
    else:
        raise InputsError(
            f"{INPUTS_FILE}: validation must be 'dataset', a file name or (x, labels), "
            f"got {type(validation).__name__}"
        )
    where = f"{INPUTS_FILE}: write_inputs"
    declared = Declared(
        declared_in,
        declared_out,
        model,
        source,
        _accuracy(validation_accuracy, where),
        _classes(classes, where),
    )
    path = out / INPUTS_FILE
    path.write_text(json.dumps(declared.as_dict(), indent=2) + "\n")
    return path


def _normalized(inputs: tuple[Tensor, ...], mean: Any, std: Any) -> tuple[Tensor, ...]:
    """The only input with ``mean`` and ``std`` set."""
    if len(inputs) != 1:
        raise InputsError(
            f"{INPUTS_FILE}: mean and std are for a model with one input; this one has "
            f"{len(inputs)}: give each input's mean and std in its entry"
        )
    where = f"{INPUTS_FILE}: {inputs[0].name!r}"
    found = replace(inputs[0], mean=_stats(mean, where, "mean"), std=_stats(std, where, "std"))
    return (found,)


def _numpy(value: Any) -> Any:
    import numpy as np

    if hasattr(value, "detach"):  # a PyTorch tensor
        value = value.detach().cpu().numpy()
    elif hasattr(value, "numpy") and not isinstance(value, np.ndarray):  # TensorFlow
        value = value.numpy()
    return np.asarray(value)


def _save_validation(out: Path, inputs: Sequence[Tensor], x: Any, labels: Any) -> str:
    import numpy as np

    if isinstance(x, Mapping):
        arrays = {str(k): _numpy(v) for k, v in x.items()}
    elif len(inputs) == 1:
        arrays = {inputs[0].name: _numpy(x)}
    else:
        raise InputsError(
            f"{INPUTS_FILE}: validation: the model has {len(inputs)} inputs; pass x as a "
            "mapping of input name to array"
        )
    missing = [t.name for t in inputs if t.name not in arrays]
    if missing or LABELS in arrays:
        raise InputsError(
            f"{INPUTS_FILE}: validation: arrays must be named after the inputs "
            f"({', '.join(t.name for t in inputs)}), not {', '.join(arrays)}"
        )
    np.savez_compressed(out / VALIDATION_FILE, **arrays, **{LABELS: _numpy(labels)})
    return VALIDATION_FILE


_EXTRA = ("validation_accuracy", "classes")


def read_inputs(folder: str | os.PathLike[str]) -> Declared | None:
    """The ``inputs.json`` of a bundle folder, or None when there is none.

    Raises:
        InputsError: One line, when the file cannot be read or is malformed.
    """
    path = Path(folder) / INPUTS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputsError(f"{path}: cannot read it ({exc})") from None
    if isinstance(data, list):  # a bare list of inputs
        data = {"inputs": data}
    if not isinstance(data, dict):
        raise InputsError(f"{path}: expected an object with 'inputs', got {type(data).__name__}")
    unknown = set(data) - {"model", "inputs", "outputs", "validation", *_EXTRA}
    if unknown:
        raise InputsError(f"{path}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    model, validation = data.get("model", "model.onnx"), data.get("validation")
    if not isinstance(model, str) or not model:
        raise InputsError(f"{path}: 'model' must be a file name, got {model!r}")
    if validation is not None and (not isinstance(validation, str) or not validation):
        raise InputsError(f"{path}: 'validation' must be 'dataset' or a file name")
    try:
        inputs = _tensors(data.get("inputs", []), "inputs")
        outputs = _tensors(data.get("outputs", []), "outputs")
        accuracy = _accuracy(data.get("validation_accuracy"), INPUTS_FILE)
        classes = _classes(data.get("classes"), INPUTS_FILE)
    except InputsError as exc:
        raise InputsError(f"{path}: {str(exc).removeprefix(INPUTS_FILE + ': ')}") from None
    if not inputs:
        raise InputsError(f"{path}: no inputs declared")
    return Declared(inputs, outputs, model, validation, accuracy, classes)
