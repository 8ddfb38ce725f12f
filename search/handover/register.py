"""``python -m search register BUNDLE --mlflow URI``: the bundle you checked, registered as it is.

``export --mlflow`` confirms, retrains and registers in one go; a bundle already exported
(and checked with ``python -m search check``) is registered by this command instead, in
seconds, without training anything: it runs the bundle check (:func:`check_bundle`, the one
``check`` runs), refuses in one line a bundle that the check rejects, then logs, registers
and (with ``--promote``) promotes the folder exactly as ``export --mlflow`` does
(:func:`search.handover.registry.register_bundle`).

:func:`refuse_overwrite` keeps ``export --mlflow`` from replacing a bundle silently: a
folder that already holds one is refused, naming this command and ``--overwrite``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from search.errors import SearchError, one_line
from search.handover.check import BundleCheckFailed, BundleError, check_bundle
from search.handover.registry import CHALLENGER, Target, preflight, register_bundle
from search.record.folders import study_folder

EXPORT_DIR = "export"
"""A study's bundle folder under ``--results``."""
PARETO_DIR = "pareto"
"""The folder under ``results/<study>/export/`` that ``--pareto`` writes by default."""
EXPORTED = ("study", "objective", "chosen", "confirmation")
"""What ``metrics.json`` holds when ``export`` wrote it: the registry's tags come from it."""


class RegisterError(SearchError):
    """The bundle cannot be registered as it is."""


def export_folder(results_dir: Path, study_name: str, pareto: bool = False) -> Path:
    """Where ``export`` writes a study's bundle (``--pareto``: its bundles) by default.

    Example:
        >>> export_folder(Path("results"), "cnn", pareto=True)
        PosixPath('results/cnn/export/pareto')
    """
    folder = study_folder(results_dir, study_name) / EXPORT_DIR
    return folder / PARETO_DIR if pareto else folder


def refuse_overwrite(out: Path, overwrite: bool) -> None:
    """Refuses, before any confirmation run, an ``export --mlflow`` into a folder that holds
    a bundle (``metrics.json``, or ``PARETO.md`` of ``--pareto``), unless ``overwrite``.

    Raises:
        RegisterError: One line naming ``register`` and ``--overwrite``.
    """
    if overwrite or not ((out / "metrics.json").is_file() or (out / "PARETO.md").is_file()):
        return
    pareto = (out / "PARETO.md").is_file()
    what = "bundles" if pareto else "a bundle"
    how = f"python -m search register {out / 'trial-N' if pareto else out}"
    raise RegisterError(
        f"--mlflow: {out} already holds {what}; `{how} --mlflow URI` registers what is there "
        "without retraining, --overwrite retrains and replaces it (or give another --out)"
    )


def checked(folder: Path, log: Any = print) -> dict[str, Any]:
    """Runs the bundle check on ``folder`` and returns its ``metrics.json``; logs the check's
    last line.

    Raises:
        RegisterError: One line, when the check rejects the bundle or cannot run, or when
            ``metrics.json`` was not written by ``export``.
    """
    try:
        lines = check_bundle(folder)
    except BundleCheckFailed as exc:
        raise RegisterError(
            f"{folder}: check rejects it ({one_line(str(exc))}); `python -m search check "
            f"{folder}` shows the whole report; nothing was registered"
        ) from None
    except BundleError as exc:
        raise RegisterError(
            f"{folder}: cannot be checked, so not registered: {one_line(str(exc))}"
        ) from None
    metrics = _exported(folder)
    log(f"check: {lines[-1]}")
    return metrics


def _exported(folder: Path) -> dict[str, Any]:
    try:
        metrics = json.loads((folder / "metrics.json").read_text())
    except (OSError, ValueError) as exc:
        raise RegisterError(
            f"{folder}/metrics.json: cannot read it ({one_line(str(exc))})"
        ) from None
    missing = [k for k in EXPORTED if not isinstance(metrics, dict) or k not in metrics]
    if missing:
        raise RegisterError(
            f"{folder}/metrics.json: no {', '.join(missing)}: register takes a bundle that "
            "`python -m search export` wrote"
        )
    return metrics


def register_checked(
    folder: Path,
    uri: str,
    model_name: str | None = None,
    promote: bool = False,
    log: Any = print,
) -> str:
    """Checks ``folder`` (:func:`checked`), then registers it as it is in the registry at
    ``uri`` under ``model_name`` (default: its study's name), alias ``challenger``; returns
    ``models:/name/N``. Nothing is trained, nothing of the trainable is imported.

    Raises:
        RegisterError: When the check rejects the bundle.
        search.handover.registry.RegistryError: When the registry refuses it.
    """
    metrics = checked(folder, log)
    target = Target(uri, model_name or str(metrics["study"]), CHALLENGER, promote)
    preflight(target)
    return register_bundle(folder, target, log)
