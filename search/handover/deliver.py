"""What ``export`` does, for the command line and for Python (``SearchResult.export``): the
MLflow target checked first, then the confirmation and the bundle (or one bundle per Pareto
point), then the registration.

Example:
    >>> deliver("demo", "sqlite:///nowhere.db", pareto=True, pick="a<1")
    Traceback (most recent call last):
    ...
    search.errors.SearchError: --pareto and --pick: give one (--pareto exports every point)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from search.errors import SearchError
from search.handover.export import export_study
from search.handover.pareto import export_pareto
from search.handover.register import export_folder, refuse_overwrite
from search.handover.registry import preflight, register_bundles, target_for
from search.handover.train import Log
from search.record.study import load_study, stored_spec


def deliver(
    study: str,
    storage: str,
    out: Path | None = None,
    top_k: int = 3,
    seeds: int = 3,
    address: str | None = None,
    results: Path = Path("results"),
    log: Log = print,
    *,
    pareto: bool = False,
    pick: str | None = None,
    mlflow: str | None = None,
    model_name: str | None = None,
    promote: bool = False,
    overwrite: bool = False,
) -> list[Path]:
    """Exports ``study`` (the arguments of ``python -m search export``); returns the bundle
    folders written.

    Raises:
        SearchError: One line: options that contradict each other, an MLflow registry that
            does not answer, a bundle already in ``out`` (without ``overwrite``), a study
            whose trials cannot be confirmed.
    """
    if pareto and pick is not None:
        raise SearchError("--pareto and --pick: give one (--pareto exports every point)")
    target = _registry(study, storage, mlflow, model_name, promote)
    if target is not None:
        refuse_overwrite(out or export_folder(results, study, pareto), overwrite)
    if pareto:
        front = export_pareto(study, storage, out, seeds, address, results, log)
        bundles = [p.bundle.out_dir for p in front.points if p.bundle is not None]
    else:
        result = export_study(study, storage, out, top_k, seeds, address, results, log, pick=pick)
        bundles = [result.out_dir]
    if target is not None:
        register_bundles(bundles, target, log)
    return bundles


def _registry(
    study: str, storage: str, uri: str | None, model_name: str | None, promote: bool
) -> Any:
    """The MLflow target of the export, checked before any confirmation run (None: none)."""
    if uri is None and model_name is None and not promote:
        spec = stored_spec(load_study(study, storage), storage, find_code=True, required=True)
        if spec.export is None or spec.export.mlflow is None:
            return None  # no MLflow import for a plain export
    target = target_for(study, storage, uri, model_name, promote)
    if target is not None:
        preflight(target)
    return target
