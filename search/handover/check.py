"""Checks an export bundle's ``model.onnx`` on its own: onnxruntime, nothing of the trainable.

    python -m search check results/cnn-digits/export
    python scripts/check_onnx.py results/cnn-digits/export

Works from any folder on any bundle, without importing the trainable's package:

1. reads the inputs the export hook declared (``inputs.json``, :mod:`search.contract.inputs`)
   or, without it, the ONNX graph's own input names, shapes and dtypes, and checks that the
   two agree;
2. runs ``model.onnx`` with onnxruntime (CPU) on random inputs of those shapes (batch 2, any
   other dynamic dimension 8; floats uniform in [0, 1), integers 0) and checks the outputs'
   shapes against the declared ones;
3. when the bundle names validation data it can use (``validation`` in ``inputs.json``: the
   ``config.yaml`` data split, as the built-in PyTorch bundles declare, or an ``.npz`` in the
   bundle; a built-in bundle without ``inputs.json`` uses its data split), scores the model
   on it and compares the accuracy with ``metrics.json`` (within one validation example).

:func:`check_bundle` returns the report's lines; a bundle that cannot be checked raises
:class:`BundleError`, one that fails a check :class:`BundleCheckFailed` (with the lines so far).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from search.contract import BUILTIN
from search.contract.dataset import image_folder, load_digits, load_shapes, materialize
from search.contract.inputs import (
    DATASET,
    INPUTS_FILE,
    LABELS,
    Declared,
    InputsError,
    Tensor,
    graph_tensors,
    read_inputs,
    shape_text,
)
from search.errors import SearchError, one_line
from search.handover import binary
from search.specs.schema import DataSpec

BATCH = 2
"""The batch of the random inputs."""
OTHER_DYNAMIC = 8
"""The size a dynamic dimension other than the batch gets in the random inputs."""
CHUNK = 1024
"""Validation examples per onnxruntime call."""
TARGETS = ("export_val_accuracy", "val_accuracy", "onnx_val_accuracy")
"""The keys of ``metrics.json``'s ``final`` the validation accuracy is compared with, in order."""


class BundleError(SearchError):
    """The bundle cannot be checked (no model.onnx, unreadable files, no onnxruntime)."""


class BundleCheckFailed(SearchError):
    """A check ran and failed; ``lines`` holds the report up to the failure."""

    def __init__(self, message: str, lines: Sequence[str]) -> None:
        super().__init__(message)
        self.lines = list(lines)


def _listing(folder: Path) -> str:
    try:
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    except OSError as exc:
        return f"it cannot be listed: {exc.strerror}"
    if not names:
        return "it is empty"
    shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
    return f"it holds {shown}"


def _first_line(exc: BaseException) -> str:
    return one_line(str(exc).strip() or type(exc).__name__, limit=300, where="first")


def _session(path: Path) -> Any:
    try:
        import onnxruntime as ort
    except ImportError:
        raise BundleError("onnxruntime is not installed: pip install onnxruntime") from None
    try:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own (untyped) exceptions
        raise BundleError(f"{path}: onnxruntime cannot load it: {_first_line(exc)}") from None


def _agree(declared: Sequence[Tensor], graph: Sequence[Tensor], what: str, source: str) -> None:
    """Raises :class:`BundleError` where ``inputs.json`` and the ONNX graph disagree."""
    by_name = {t.name: t for t in graph}
    wrong = [t.name for t in declared if t.name not in by_name]
    if wrong:
        raise BundleError(
            f"{source} declares {what} {', '.join(wrong)}, but model.onnx has "
            f"{', '.join(by_name) or 'none'}: fix {INPUTS_FILE}"
        )
    for t in declared:
        g = by_name[t.name]
        if t.dtype != g.dtype:
            raise BundleError(
                f"{source}: {what} {t.name!r} is declared {t.dtype}, model.onnx takes {g.dtype}"
            )
        fixed = [(a, b) for a, b in zip(t.shape, g.shape, strict=False) if isinstance(a, int) and b]
        if len(t.shape) != len(g.shape) or any(isinstance(b, int) and a != b for a, b in fixed):
            raise BundleError(
                f"{source}: {what} {t.name!r} is declared {shape_text(t.shape)}, model.onnx "
                f"has {shape_text(g.shape)}"
            )


def _concrete(t: Tensor, graph: Tensor | None) -> tuple[int, ...]:
    """The shape of ``t``'s random input: batch 2, other dynamic dimensions 8."""
    dims: list[int] = []
    for i, d in enumerate(t.shape):
        g = graph.shape[i] if graph is not None and i < len(graph.shape) else None
        if isinstance(d, int):
            dims.append(d)
        elif isinstance(g, int):
            dims.append(g)
        else:
            dims.append(BATCH if i == 0 else OTHER_DYNAMIC)
    return tuple(dims)


def _dtype(t: Tensor) -> np.dtype[Any]:
    try:
        return np.dtype(t.dtype)
    except TypeError:
        raise BundleError(
            f"input {t.name!r}: dtype {t.dtype} has no numpy equivalent; this check cannot feed it"
        ) from None


def _random(t: Tensor, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dtype = _dtype(t)
    if np.issubdtype(dtype, np.floating):
        return rng.random(shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


def _run(session: Any, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(out) for out in session.run(None, dict(feed))]


def _outputs_agree(declared: Sequence[Tensor], got: Sequence[np.ndarray], batch: int) -> str:
    """Where an output's shape differs from the declared one, the problem; else ''."""
    for t, value in zip(declared, got, strict=False):
        want = [batch if i == 0 and d is None else d for i, d in enumerate(t.shape)]
        if len(want) != value.ndim or any(
            isinstance(w, int) and w != n for w, n in zip(want, value.shape, strict=False)
        ):
            return (
                f"output {t.name!r} has shape {tuple(value.shape)} for a batch of {batch}, "
                f"declared {shape_text(t.shape)}"
            )
    return ""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BundleError(f"{path}: cannot read it ({_first_line(exc)})") from None


def _config(folder: Path) -> dict[str, Any] | None:
    path = folder / "config.yaml"
    if not path.is_file():
        return None
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise BundleError(f"{path}: cannot read it ({_first_line(exc)})") from None
    return data if isinstance(data, dict) else None


def _dataset_split(folder: Path, config: dict[str, Any] | None) -> tuple[Any, Any, str] | str:
    """``(x_val, y_val, what)`` of ``config.yaml``'s data, or why there is none."""
    if config is None:
        return "config.yaml is missing, so the data split is unknown"
    from pydantic import ValidationError

    try:
        spec = DataSpec.model_validate(config.get("data") or {})
    except ValidationError as exc:
        return f"config.yaml: data: {_first_line(exc)}"
    if spec.name == "digits":
        data = load_digits(spec.val_fraction, spec.split_seed)
        return data.x_val, data.y_val, f"the digits' validation split ({len(data.y_val)})"
    if spec.name == "shapes":
        data = load_shapes(
            spec.val_fraction, spec.split_seed, spec.samples, spec.difficulty, spec.image_size
        )
        return data.x_val, data.y_val, f"the shapes' validation split ({len(data.y_val)})"
    if not spec.path or not Path(spec.path).is_dir():
        return f"the image folder {spec.path} is not on this machine"
    try:
        data = materialize(
            image_folder(spec.path, spec.image_size, spec.val_fraction, spec.split_seed)
        )
    except (OSError, ValueError) as exc:
        return f"the image folder {spec.path} cannot be read: {_first_line(exc)}"
    return data.x_val, data.y_val, f"the image folder's validation split ({len(data.y_val)})"


def prepared(t: Tensor, raw: Any) -> np.ndarray:
    """Raw rows as the model takes them: ``(raw / scale - mean) / std``, each step only when
    ``t`` declares it (what a server does with ``inputs.json``)."""
    x = np.asarray(raw, dtype=np.float64 if t.scale or t.mean or t.std else None)
    if t.scale:
        x = x / t.scale
    if t.mean is not None:
        x = x - np.asarray(t.mean)
    if t.std is not None:
        x = x / np.asarray(t.std)
    return x


def validation_rows(
    folder: Path, declared: Declared | None, inputs: Sequence[Tensor], builtin: bool
) -> tuple[dict[str, np.ndarray], np.ndarray, str] | str:
    """The bundle's validation arrays (by input name) as the model takes them, their labels
    and what they are; or why there are none (``builtin``: a built-in trainable's bundle, whose
    validation rows are the data split its ``config.yaml`` names). The served model's input
    example reads them too (:mod:`search.handover.mlflow_model`)."""
    source = declared.validation if declared is not None else (DATASET if builtin else None)
    if source is None:
        why = "no inputs.json" if declared is None else "inputs.json names no validation data"
        return (
            f"{why}; the export hook can add it: search.write_inputs(..., validation=(x, labels))"
        )
    if source == DATASET:
        if len(inputs) != 1:
            return f"the model has {len(inputs)} inputs; the data split feeds one"
        split = _dataset_split(folder, _config(folder))
        if isinstance(split, str):
            return split
        x, y, what = split
        return {inputs[0].name: prepared(inputs[0], x)}, np.asarray(y), what
    path = folder / source
    if not path.is_file():
        raise BundleError(f"{INPUTS_FILE} names validation data {source}, which is not in {folder}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: np.asarray(npz[k]) for k in npz.files}
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path}: cannot read it ({_first_line(exc)})") from None
    missing = [n for n in [t.name for t in inputs] + [LABELS] if n not in arrays]
    if missing:
        raise BundleError(f"{path}: no array {', '.join(missing)} (it has {', '.join(arrays)})")
    labels = arrays.pop(LABELS)
    return arrays, labels, f"{source} ({len(labels)})"


def accuracy_name(config: Mapping[str, Any] | None) -> str:
    """The study's own name of its validation accuracy (``eval_accuracy`` of a Hugging Face
    study), read from ``config.yaml``'s objectives; ``val_accuracy`` when none names one.

    Example:
        >>> accuracy_name({"objective": [{"metric": "latency_ms"}, {"metric": "eval_accuracy"}]})
        'eval_accuracy'
        >>> accuracy_name({"objective": {"metric": "val_loss"}}), accuracy_name(None)
        ('val_accuracy', 'val_accuracy')
    """
    objective = (config or {}).get("objective")
    objectives = objective if isinstance(objective, list) else [objective]
    metrics = [str(o.get("metric", "")) for o in objectives if isinstance(o, Mapping)]
    return next((m for m in metrics if "accuracy" in m), "val_accuracy")


def _target(
    folder: Path, declared: Declared | None, name: str = "val_accuracy"
) -> tuple[str, float, str] | str:
    """What the ONNX accuracy is compared with, as ``(how the report names it, value, file)``:
    the framework's accuracy on exactly the shipped rows when ``inputs.json`` has it (the
    whole split's, in ``metrics.json``, would compare a subset with the split), else
    ``metrics.json``'s final accuracy; or why there is none."""
    shipped = declared is not None and declared.validation not in (None, DATASET)
    if shipped and declared is not None and declared.validation_accuracy is not None:
        how = "the framework on the same rows, inputs.json"
        return how, declared.validation_accuracy, INPUTS_FILE
    path = folder / "metrics.json"
    if not path.is_file():
        return "metrics.json is missing"
    data = _read_json(path)
    final = data.get("final") if isinstance(data, dict) else None
    if not isinstance(final, dict):
        return "metrics.json has no final metrics"
    keys = list(dict.fromkeys([f"export_{name}", name, *TARGETS, f"onnx_{name}"]))
    for key in keys:
        value = final.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            return f"exported {key}", float(value), "metrics.json"
    return f"metrics.json's final metrics have no {' or '.join(keys)}"


def _not_classes(scores: np.ndarray, labels: np.ndarray) -> str:
    """Why argmax of ``scores`` cannot be scored against ``labels``; '' when it can."""
    if scores.ndim != 2 or scores.shape[1] < 2:
        return (
            f"the first output has shape {scores.shape}, not one score a class (a single "
            "column of a binary classifier: declare classes=[negative, positive] with "
            "write_inputs)"
        )
    numeric = np.issubdtype(labels.dtype, np.number) and not np.issubdtype(
        labels.dtype, np.complexfloating
    )
    if labels.ndim != 1 or not numeric or not np.array_equal(labels, np.round(labels)):
        return f"the labels (shape {labels.shape}, {labels.dtype}) are not class numbers"
    return ""


def _subset_hint(declared: Declared | None, source: str) -> str:
    """Where shipped validation rows were compared with ``metrics.json``'s accuracy on the
    whole split: the fix when they are a subset of it; '' otherwise."""
    if declared is None or declared.validation in (None, DATASET) or source != "metrics.json":
        return ""
    return (
        f" (on the whole validation split); if {declared.validation} holds only some of its "
        "rows, give the framework's accuracy on exactly those rows: "
        "search.write_inputs(..., validation=(x, labels), validation_accuracy=...)"
    )


def no_onnx(folder: Path) -> str:
    """The one line for a bundle without ``model.onnx``: how its export hook writes one (a
    Keras model's first, when the bundle holds one)."""
    keras = "search.keras.save_onnx(model, out_dir) (search.keras.train_and_save calls it)"
    torch = "torch.onnx.export(model, example, out_dir / 'model.onnx', dynamo=False)"
    how = f"{keras}; for PyTorch, {torch}"
    if not any(folder.glob("*.keras")):
        how = f"{torch}; for Keras, {keras}"
    return (
        f"no model.onnx in {folder} ({_listing(folder)}); this check runs ONNX models: write "
        f"one from the export hook with {how}"
    )


def check_bundle(folder: str | Path) -> list[str]:
    """Checks ``folder``'s ``model.onnx`` (module docstring) and returns the report's lines.

    Raises:
        BundleError: One line, when the bundle cannot be checked.
        BundleCheckFailed: When a check fails; its ``lines`` hold the report so far.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise BundleError(f"no bundle folder at {folder}")
    try:
        declared = read_inputs(folder)
    except InputsError as exc:
        raise BundleError(str(exc)) from None
    if declared is not None and not declared.model.endswith(".onnx"):
        declared = None  # it describes another file (model.keras, a SavedModel)
    model = folder / (declared.model if declared else "model.onnx")
    if not model.is_file():
        raise BundleError(no_onnx(folder))
    config = _config(folder)
    trainable = str((config or {}).get("trainable", ""))
    builtin = trainable in BUILTIN
    session = _session(model)
    import onnxruntime as ort

    graph_in = list(graph_tensors(session.get_inputs()))
    graph_out = list(graph_tensors(session.get_outputs()))
    if declared is not None:
        _agree(declared.inputs, graph_in, "input(s)", INPUTS_FILE)
        missing = [t.name for t in graph_in if t.name not in {d.name for d in declared.inputs}]
        if missing:
            raise BundleError(
                f"{INPUTS_FILE} leaves out the input(s) {', '.join(missing)} that model.onnx "
                "requires: fix it"
            )
        _agree(declared.outputs, graph_out, "output(s)", INPUTS_FILE)
        inputs = list(declared.inputs)
        origin = f"declared in {INPUTS_FILE}"
    else:
        inputs = graph_in
        origin = f"read from the ONNX graph (no {INPUTS_FILE})"
    by_name = {t.name: t for t in graph_in}
    outputs = (list(declared.outputs) if declared else []) or graph_out
    lines = [f"{model.name}: onnxruntime {ort.__version__}, inputs {origin}"]
    lines += [f"  input  {t.text('')}" for t in inputs]
    lines += [f"  output {t.text('')}" for t in outputs]

    rng = np.random.default_rng(0)
    feed = {t.name: _random(t, _concrete(t, by_name.get(t.name)), rng) for t in inputs}
    start = time.perf_counter()
    try:
        got = _run(session, feed)
    except Exception as exc:  # onnxruntime's own exceptions
        shapes = ", ".join(f"{k} {tuple(v.shape)} {v.dtype}" for k, v in feed.items())
        raise BundleCheckFailed(
            f"model.onnx fails on random inputs of the declared shapes ({shapes}): "
            f"{_first_line(exc)}",
            lines,
        ) from None
    seconds = time.perf_counter() - start
    problem = _outputs_agree(outputs, got, BATCH)
    finite = all(np.isfinite(v).all() for v in got if np.issubdtype(v.dtype, np.number) and v.size)
    lines.append(
        "random inputs ("
        + ", ".join(f"{k} {tuple(v.shape)}" for k, v in feed.items())
        + f"): outputs {', '.join(str(tuple(v.shape)) for v in got)} in {1000 * seconds:.1f} ms"
        + ("" if finite else " (some not finite)")
    )
    if problem:
        raise BundleCheckFailed(problem, lines)

    val = validation_rows(folder, declared, inputs, builtin)
    name = accuracy_name(config)
    target = _target(folder, declared, name)
    if isinstance(val, str) or isinstance(target, str):
        why = val if isinstance(val, str) else target
        lines.append(f"validation accuracy: not checked ({why})")
        lines.append("OK: model.onnx runs on inputs of the declared shapes")
        return lines
    arrays, labels, what = val
    for t in inputs:
        arrays[t.name] = np.ascontiguousarray(arrays[t.name], dtype=_dtype(t))
        shape = arrays[t.name].shape
        if len(shape) != len(t.shape) or any(
            isinstance(d, int) and d != n for d, n in zip(t.shape[1:], shape[1:], strict=False)
        ):
            raise BundleError(
                f"validation data {what}: input {t.name!r} has shape {shape}, declared "
                f"{shape_text(t.shape)}: fix {INPUTS_FILE}"
            )
    n = len(labels)
    sizes = {k: len(v) for k, v in arrays.items()}
    if n == 0 or any(s != n for s in sizes.values()):
        raise BundleError(f"validation data {what}: {n} labels for inputs of sizes {sizes}")
    start = time.perf_counter()
    try:
        scores = np.concatenate(
            [
                _run(session, {k: v[i : i + CHUNK] for k, v in arrays.items()})[0]
                for i in range(0, n, CHUNK)
            ]
        )
    except Exception as exc:  # onnxruntime's own exceptions
        raise BundleCheckFailed(
            f"model.onnx fails on the validation data {what}: {_first_line(exc)}", lines
        ) from None
    seconds = time.perf_counter() - start
    lines.append(
        f"onnxruntime {ort.__version__}: {n} validation examples in {1000 * seconds:.1f} ms"
    )
    if declared is not None and binary.one_column(scores, declared.classes):
        scores = binary.two_columns(scores, binary.kind_of(model))
    why = _not_classes(scores, labels)
    if why:
        lines.append(f"validation accuracy: not checked ({why})")
        lines.append("OK: model.onnx runs on inputs of the declared shapes")
        return lines
    how, exported, source = target
    accuracy = float((scores.argmax(axis=1) == labels).mean())
    diff, allowed = abs(accuracy - exported), 1.0 / n
    lines.append(
        f"{name} {accuracy:.4f} (onnx, {what}) vs {exported:.4f} ({how}): "
        f"difference {diff:.4f}, allowed {allowed:.4f} (one example)"
    )
    if diff > allowed:
        raise BundleCheckFailed(
            f"model.onnx scores {accuracy:.4f} on {what}, {source} says {exported:.4f}"
            + _subset_hint(declared, source),
            lines,
        )
    lines.append("OK: model.onnx reproduces the exported validation accuracy")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``scripts/check_onnx.py BUNDLE``: the report on stdout; exit 0 when every check passes,
    1 when one fails, 2 when the bundle cannot be checked (one line on stderr)."""
    import argparse

    parser = argparse.ArgumentParser(
        description="Check an export bundle's model.onnx with onnxruntime, without importing "
        "the trainable."
    )
    parser.add_argument("bundle", type=Path, help="the export folder (model.onnx)")
    args = parser.parse_args(argv)
    try:
        lines = check_bundle(args.bundle)
    except BundleCheckFailed as exc:
        print("\n".join(exc.lines))
        print(f"MISMATCH: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except SearchError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0
