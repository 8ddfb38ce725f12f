"""``python -m search check models:/name@champion --mlflow URI``: the registered model, loaded
as a service would load it, scored on its bundle's validation data.

The model is loaded with ``mlflow.pyfunc.load_model`` (in this command's own process, nothing
of the trainable imported); the bundle the version was logged with (the run's ``bundle/``
artifacts: ``inputs.json``, ``config.yaml``, ``metrics.json``, ``validation.npz``) gives the
validation data, as for a bundle folder (:mod:`search.handover.check`). The accuracy must
match ``metrics.json`` within its ``tolerance``, the one ``train`` uses.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from search.contract.inputs import read_inputs
from search.errors import one_line
from search.handover import binary, check, mlflow_model
from search.handover.bundle import TOLERANCE
from search.handover.registry import (
    BUNDLE_ARTIFACTS,
    RegistryError,
    Target,
    fluent_on,
    quiet_client,
    scrub,
)


def predict_classes(model: Any, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The argmax of the model's first output, in chunks."""
    n = len(next(iter(arrays.values())))
    found = []
    for start in range(0, n, check.CHUNK):
        out = model.predict({k: v[start : start + check.CHUNK] for k, v in arrays.items()})
        first = next(iter(out.values())) if isinstance(out, dict) else np.asarray(out)
        found.append(np.asarray(first).argmax(axis=1))
    return np.concatenate(found)


def check_registered(model_uri: str, target: Target) -> list[str]:
    """Loads ``model_uri`` from ``target``'s registry and scores it (module docstring).

    Raises:
        RegistryError: When the model or its bundle cannot be found or loaded.
        check.BundleCheckFailed: When its accuracy differs from ``metrics.json``'s.
    """
    import mlflow

    real = target.real
    if real.startswith("sqlite:///") and not Path(real.removeprefix("sqlite:///")).is_file():
        raise RegistryError(  # MLflow would create an empty registry there, then not find it
            f"--mlflow {target.shown}: no such file; export --mlflow writes it (a relative "
            "path is read from the current folder)"
        )
    client = quiet_client(real)
    with fluent_on(real), tempfile.TemporaryDirectory(prefix="search-check-") as folder:
        try:
            version = _version(client, model_uri)
            model = mlflow.pyfunc.load_model(model_uri)
            mlflow.artifacts.download_artifacts(
                run_id=version.run_id, artifact_path=BUNDLE_ARTIFACTS, dst_path=folder
            )
        except Exception as exc:
            why = one_line(scrub(str(getattr(exc, "message", exc)), target.uri), limit=300)
            raise RegistryError(f"{model_uri} in {target.shown}: cannot load it ({why})") from None
        return _score(model_uri, version, model, Path(folder) / BUNDLE_ARTIFACTS)


def _version(client: Any, model_uri: str) -> Any:
    name, at, alias = model_uri.removeprefix("models:/").partition("@")
    if at:
        return client.get_model_version_by_alias(name, alias)
    name, _, number = name.partition("/")
    return client.get_model_version(name, number)


def _score(model_uri: str, version: Any, model: Any, folder: Path) -> list[str]:
    lines = [f"{model_uri}: version {version.version} of {version.name}, run {version.run_id}"]
    declared = read_inputs(folder)
    if declared is None:
        raise RegistryError(f"{model_uri}: its bundle has no inputs.json to score it on")
    got = check.validation_rows(folder, declared, declared.inputs, builtin=True)
    target = check._target(folder, declared)
    if isinstance(got, str) or isinstance(target, str):
        why = got if isinstance(got, str) else target
        raise RegistryError(f"{model_uri}: cannot score it: {why}")
    arrays, labels, what = got
    arrays = {
        k: v.astype(np.dtype(t.dtype))
        for (k, v), t in zip(arrays.items(), declared.inputs, strict=False)
    }
    if _labelled(model):
        found = _served(model, folder, declared, arrays, labels, lines)
    else:  # a version registered before the served model, or a Keras one: the model's input
        found = predict_classes(model, arrays) == labels
    accuracy = float(np.mean(found))
    key, expected, _ = target
    tolerance = float(check._read_json(folder / "metrics.json").get("tolerance", TOLERANCE))
    diff = abs(accuracy - expected)
    line = (
        f"mlflow.pyfunc scores {accuracy:.4f} on {what}, {key} says "
        f"{expected:.4f} (difference {diff:.4f}, tolerance {tolerance})"
    )
    lines.append(line)
    if diff > tolerance:
        raise check.BundleCheckFailed(line, lines)
    lines.append(f"OK: {model_uri} reproduces the exported accuracy")
    return lines


def _labelled(model: Any) -> bool:
    """Whether ``model`` is the served model of :mod:`search.handover.served_model` (raw
    rows in, labels out), known by its ``logits`` parameter."""
    params = getattr(model.metadata.get_params_schema(), "params", None) or []
    return any(p.name == mlflow_model.LOGITS for p in params)


def _names(declared: Any, indices: np.ndarray) -> np.ndarray:
    """The class names of class numbers (the numbers as text when the bundle names none)."""
    indices = np.asarray(indices).astype(int)
    if declared.classes:
        return np.asarray(declared.classes, dtype=str)[indices]
    return indices.astype(str)


def _served(
    model: Any,
    folder: Path,
    declared: Any,
    prepared: dict[str, np.ndarray],
    labels: np.ndarray,
    lines: list[str],
) -> np.ndarray:
    """Feeds the raw rows to the served model; returns which answers name the right class
    and adds a line on how its labels agree with the bundle's ``model.onnx`` on those rows.

    Raises:
        check.BundleCheckFailed: When more than one row's label differs from the graph's.
    """
    by_name = {t.name: t for t in declared.inputs}
    raw = {k: mlflow_model.raw(by_name[k], v) for k, v in prepared.items()}
    n = len(labels)
    answers = np.concatenate(
        [_label(model.predict({k: v[i : i + check.CHUNK] for k, v in raw.items()}))
         for i in range(0, n, check.CHUNK)]
    ).astype(str)  # fmt: skip
    right = answers == _names(declared, labels)
    graph = folder / declared.model
    if not graph.is_file():
        lines.append(f"raw rows in, labels out: {int(right.sum())} of {n} name their class")
        return right
    session = check._session(graph)
    scores = np.concatenate(
        [
            check._run(session, {k: v[i : i + check.CHUNK] for k, v in prepared.items()})[0]
            for i in range(0, n, check.CHUNK)
        ]
    )
    if binary.one_column(scores, declared.classes):
        scores = binary.two_columns(scores, binary.kind_of(graph))
    same = int((answers == _names(declared, scores.argmax(axis=1))).sum())
    lines.append(
        f"raw rows in, labels out: {same} of {n} labels agree with the bundle's {graph.name}"
    )
    if n - same > 1:  # one row may sit on a tie that undoing the standardization tips
        raise check.BundleCheckFailed(
            f"{n - same} of {n} served labels differ from the bundle's {graph.name}", lines
        )
    return right


def _label(answer: Any) -> np.ndarray:
    """The ``label`` column of a served answer; one line when it has none (a graph whose
    first output is not one score a class, and not a binary one with its two classes)."""
    if isinstance(answer, dict) or "label" not in getattr(answer, "columns", ()):
        keys = ", ".join(map(str, answer.keys() if isinstance(answer, dict) else answer.columns))
        raise RegistryError(
            f"the served model answers no label (its answer holds {keys}): its first output "
            "is not one score a class; a binary classifier with one output column needs "
            "classes=[negative, positive] in write_inputs"
        )
    return np.asarray(answer["label"])
