"""Lineage for ``environment.txt``: the user's project commit, the data's fingerprint and the
loader that returned it.

``environment.txt`` already records this tool's git commit; these lines add what the bundle was
made *from*:

    project git 3f2a... (/home/me/proj, with uncommitted changes)
    data loader myproj.data:load {"path": "data.csv", "rows": 500}
    data x_train float32 (400, 30), y_train int64 (400,), x_val float32 (100, 30), ...
    data fingerprint sha256:9b1c... (x_train, y_train, x_val, y_val as loaded: names, ...)
    frameworks torch 2.14.1, lightning 2.6.0, torchmetrics 1.9.0

The project is the git checkout holding the trainable's module file (``not a git checkout``
when there is none). The data's fingerprint (:func:`data_fingerprint`) says what it covers:
the arrays the loader returned, as loaded, with their names, dtypes, shapes and bytes, in
order. It is the one fingerprint of a bundle: ``metrics.json``'s ``data_fingerprint``, the
model card and the registry's ``search.data_fingerprint`` hold the same string.
The frameworks are those of :data:`FRAMEWORKS` that the process writing the bundle imported:
``export`` trains the final model in it, so they are the ones its trainable used (and that
``metrics.json``, the model card and the registry's ``search.frameworks`` name).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.contract import BUILTIN

if TYPE_CHECKING:
    from search.contract.dataset import Dataset
    from search.specs.schema import DataSpec

FRAMEWORKS = {
    "torch": "torch",
    "torchvision": "torchvision",
    "lightning": "lightning",
    "pytorch_lightning": "pytorch-lightning",
    "torchmetrics": "torchmetrics",
    "transformers": "transformers",
    "tokenizers": "tokenizers",
    "accelerate": "accelerate",
    "datasets": "datasets",
    "peft": "peft",
    "timm": "timm",
    "tensorflow": "tensorflow",
    "keras": "keras",
    "tf_keras": "tf-keras",
    "jax": "jax",
    "flax": "flax",
    "sklearn": "scikit-learn",
    "xgboost": "xgboost",
    "lightgbm": "lightgbm",
}
"""Module -> distribution of the training frameworks a bundle names when they are imported."""
ARRAYS = ("x_train", "y_train", "x_val", "y_val")
"""The arrays of a :class:`~search.contract.Dataset` the fingerprint covers, in order."""


def git(folder: Path, *args: str) -> str:
    """``git -C folder args`` 's output, stripped; '' when git fails or is missing."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def module_file(trainable: str) -> Path | None:
    """The file of the module that holds ``trainable`` (a built-in name or
    ``package.module:function``), found without importing it; None when there is none."""
    target = BUILTIN.get(trainable, trainable)
    module = target.partition(":")[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return Path(origin).resolve() if origin and origin not in ("built-in", "frozen") else None


def project_commit(trainable: str) -> str:
    """``project git <commit> (<checkout>[, with uncommitted changes])`` for the checkout
    holding the trainable's module, or ``project git none (not a git checkout)``."""
    path = module_file(trainable)
    root = git(path.parent, "rev-parse", "--show-toplevel") if path else ""
    commit = git(Path(root), "rev-parse", "HEAD") if root else ""
    if not commit:
        return "project git none (not a git checkout)"
    dirty = ", with uncommitted changes" if git(Path(root), "status", "--porcelain") else ""
    return f"project git {commit} ({root}{dirty})"


def fingerprint(data: Any) -> tuple[str, str]:
    """``(shapes, fingerprint)``: each array's dtype and shape, and :func:`data_fingerprint`.

    ``data`` is a :class:`~search.contract.Dataset` or what a loader returned: a mapping (the
    examples' dicts) or an object with those attributes; arrays it lacks are left out.
    """
    import numpy as np

    digest = hashlib.sha256()
    parts, names = [], []
    for name in ARRAYS:
        found = data.get(name) if isinstance(data, Mapping) else getattr(data, name, None)
        if found is None:
            continue
        array = np.ascontiguousarray(found)
        parts.append(f"{name} {array.dtype} {tuple(array.shape)}")
        names.append(name)
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    covers = f"{', '.join(names) or 'no arrays'} as loaded: names, dtypes, shapes and bytes"
    return ", ".join(parts), f"sha256:{digest.hexdigest()} ({covers})"


def data_fingerprint(data: Any) -> str:
    """The data's one fingerprint, saying what it covers (module docstring).

    Example:
        >>> import numpy as np
        >>> print(data_fingerprint({"x_val": np.zeros(2, np.float32), "y_val": np.ones(2)}))
        sha256:... (x_val, y_val as loaded: names, dtypes, shapes and bytes)
    """
    return fingerprint(data)[1]


def data_lines(data: Dataset | None, spec: DataSpec | None) -> list[str]:
    """The ``data ...`` lines of ``environment.txt`` (none when nothing is known)."""
    lines = []
    if spec is not None and spec.loader is not None:
        lines.append(f"data loader {spec.loader} {json.dumps(spec.args, default=str)}")
    elif spec is not None and spec.name == "none":
        lines.append("data loaded by the trainable itself (no data: in the spec)")
    elif spec is not None:
        lines.append(f"data built-in {spec.name}")
    if data is not None:
        shapes, digest = fingerprint(data)
        path = getattr(data, "path", None)
        where = f" (read from {path} per trial)" if path else ""
        lines += [f"data {shapes}{where}", f"data fingerprint {digest}"]
    return lines


def frameworks() -> list[str]:
    """``torch 2.14.1``, ... for each of :data:`FRAMEWORKS` this process imported, in its
    order (module docstring)."""
    found = []
    for module, distribution in FRAMEWORKS.items():
        if module not in sys.modules:
            continue
        try:
            found.append(f"{distribution} {importlib.metadata.version(distribution)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def lineage_lines(trainable: str, data: Dataset | None, spec: DataSpec | None) -> list[str]:
    """Every lineage line: the project's commit, the data's, then the frameworks imported."""
    used = ", ".join(frameworks()) or "none of " + ", ".join(FRAMEWORKS.values())
    return [project_commit(trainable), *data_lines(data, spec), f"frameworks {used}"]
