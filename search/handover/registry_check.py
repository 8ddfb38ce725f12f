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
from search.handover import check
from search.handover.bundle import TOLERANCE
from search.handover.registry import BUNDLE_ARTIFACTS, RegistryError, Target, quiet_client, scrub


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
    mlflow.set_tracking_uri(real)
    mlflow.set_registry_uri(real)
    try:
        version = _version(client, model_uri)
        model = mlflow.pyfunc.load_model(model_uri)
        folder = Path(tempfile.mkdtemp(prefix="search-check-"))
        mlflow.artifacts.download_artifacts(
            run_id=version.run_id, artifact_path=BUNDLE_ARTIFACTS, dst_path=str(folder)
        )
    except Exception as exc:
        why = one_line(scrub(str(getattr(exc, "message", exc)), target.uri), limit=300)
        raise RegistryError(f"{model_uri} in {target.shown}: cannot load it ({why})") from None
    return _score(model_uri, version, model, folder / BUNDLE_ARTIFACTS)


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
    got = check._validation(folder, declared, declared.inputs, builtin=True)
    target = check._target(folder, declared)
    if isinstance(got, str) or isinstance(target, str):
        why = got if isinstance(got, str) else target
        raise RegistryError(f"{model_uri}: cannot score it: {why}")
    arrays, labels, what = got
    arrays = {
        k: v.astype(np.dtype(t.dtype))
        for (k, v), t in zip(arrays.items(), declared.inputs, strict=False)
    }
    accuracy = float(np.mean(predict_classes(model, arrays) == labels))
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
