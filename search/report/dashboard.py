"""Serves ``optuna-dashboard`` on a study storage, on loopback unless told otherwise, and
writes what the dashboard shows beyond the trials themselves.

The dashboard reads only the storage, so a study's spec and per-epoch metrics stay invisible
unless they are put there: the study's note (the spec as YAML and a summary, written with
:func:`optuna_dashboard.save_note`, :func:`dashboard_notes`) and each trial's artifacts
(:mod:`search.report.artifacts`). Both are written again only when they changed, so ``run``,
``report`` and ``dashboard`` can each publish at little cost.
"""

from __future__ import annotations

import importlib
import importlib.util
import ipaddress
import re
import socket
import sys
import warnings
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, BinaryIO

import yaml

from search.record.artifacts import ARTIFACTS_DIR, store_path
from search.record.folders import safe_name, study_folder
from search.record.lease import LEASE_ATTR, held
from search.record.storage import open_storage
from search.report.artifacts import publish_artifacts

if TYPE_CHECKING:
    import optuna

LOOPBACK = "127.0.0.1"
STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")
UPLOADS = "_uploads"
"""The folder under ``results/`` that files uploaded through the dashboard itself go to."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (``127.0.0.0/8``, ``::1``, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def port_is_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def study_note(study: optuna.Study) -> str:
    """The study's note in Markdown: a summary without links, then the stored spec as YAML.

    The summary counts trials by state and epochs trained, and names the best value, or for
    a study of several objectives the number of Pareto-optimal trials.
    """
    trials = study.get_trials(deepcopy=False)
    states = Counter(t.state.name for t in trials)
    counts = ", ".join(f"{states[s]} {s.lower()}" for s in STATES if states[s])
    epochs = sum(_epochs(t) for t in trials)
    lines = [
        f"## {study.study_name}",
        "",
        f"**Trials:** {len(trials)} ({counts or 'none yet'}); **epochs trained:** {epochs}",
        "",
        f"**{_best_line(study, states['COMPLETE'] > 0)}**",
    ]
    spec = study.user_attrs.get("spec")  # shown as stored, even one this version cannot read
    if isinstance(spec, dict):
        lines += ["", "### Spec", "", "```yaml", spec_yaml(spec), "```"]
    return "\n".join(lines) + "\n"


def spec_yaml(spec: dict[str, Any]) -> str:
    """The spec as the README writes one: a line per field, small mappings inline."""
    return "".join(
        yaml.safe_dump(
            {key: value},
            sort_keys=False,
            default_flow_style=None if isinstance(value, dict | list) else False,
            width=100,
        )
        for key, value in spec.items()
    ).rstrip()


def _best_line(study: optuna.Study, any_complete: bool) -> str:
    """``best val_accuracy 0.97 (trial #4)``, or the size of the Pareto front."""
    names = study.metric_names or [f"objective {i}" for i in range(len(study.directions))]
    if not any_complete:
        return "No trial has completed yet."
    if len(study.directions) > 1:  # study.best_trial would raise
        front = len(study.best_trials)
        goals = ", ".join(
            f"{n} {d.name.lower()}" for n, d in zip(names, study.directions, strict=False)
        )
        return f"Pareto front: {front} trial{'s' * (front != 1)} ({goals})"
    best = study.best_trial
    return f"Best {names[0]}: {best.value:.6g} (trial #{best.number})"


def _epochs(trial: optuna.trial.FrozenTrial) -> int:
    recorded = trial.user_attrs.get("epochs")
    return recorded if isinstance(recorded, int) else len(trial.intermediate_values)


def publish_note(study: optuna.Study) -> bool:
    """Writes :func:`study_note` as the study's note unless it is already; whether it wrote."""
    notes = dashboard_notes()
    body = study_note(study)
    if notes.get_note(study) == body:
        return False
    notes.save_note(study, body)
    return True


def dashboard_notes() -> ModuleType:
    """optuna-dashboard's notes (``save_note``, ``get_note``: its module ``_note``, which
    imports only optuna), loaded without the package's ``__init__``.

    Why not ``from optuna_dashboard import save_note``: the package's ``__init__`` imports
    the whole web app, whose importance view imports scikit-learn: a slow import at the end of
    every ``run``, for a note. The dashboard itself reads the notes written this way
    (tests/test_dashboard_artifacts.py asks its server for them).
    """
    if "optuna_dashboard" in sys.modules:  # imported already: nothing to save
        return importlib.import_module("optuna_dashboard._note")
    package = importlib.util.find_spec("optuna_dashboard")  # finds, does not import
    if package is None or not package.submodule_search_locations:
        raise ImportError("optuna-dashboard is not installed: pip install optuna-dashboard")
    path = Path(next(iter(package.submodule_search_locations))) / "_note.py"
    spec = importlib.util.spec_from_file_location("optuna_dashboard._note", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def publish_study(study: optuna.Study, results_dir: Path) -> int:
    """The study's note and its trials' artifacts; returns how many trials got artifacts."""
    with warnings.catch_warnings():  # matplotlib's and optuna's experimental notes
        warnings.simplefilter("ignore")
        publish_note(study)
        return publish_artifacts(study, results_dir)


def publish_all(storage_url: str, results_dir: Path) -> dict[str, int]:
    """:func:`publish_study` for each study with a folder in ``results_dir``, except those a
    live driver holds (only the driver writes to its study; its ``run`` publishes at the end).

    Returns:
        Each published study's name and how many trials got artifacts.
    """
    import optuna

    storage = open_storage(storage_url)
    done = {}
    for name in optuna.study.get_all_study_names(storage):
        if not safe_name(name) or not study_folder(results_dir, name).is_dir():
            continue  # a name that would leave results_dir: never a folder of ours
        study = optuna.load_study(study_name=name, storage=storage)
        if not held(study.user_attrs.get(LEASE_ATTR)):
            done[name] = publish_study(study, results_dir)
    return done


class ResultsArtifactStore:
    """An :class:`optuna.artifacts` store over every study's folder in ``results_dir``.

    optuna-dashboard takes one store for all the studies it shows; each study keeps its own
    folder, and artifact ids are UUIDs, so a read finds the one folder holding the id. Files
    uploaded through the dashboard go to ``results_dir/_uploads/artifacts``.
    """

    def __init__(self, results_dir: Path) -> None:
        self._results = Path(results_dir)

    def _find(self, artifact_id: str) -> Path:
        from optuna.artifacts.exceptions import ArtifactNotFound

        if re.fullmatch(r"[0-9A-Za-z-]+", artifact_id):
            for path in self._results.glob(f"*/{ARTIFACTS_DIR}/{artifact_id}"):
                return path
        raise ArtifactNotFound(f"artifact {artifact_id} not found under {self._results}")

    def open_reader(self, artifact_id: str) -> BinaryIO:
        """The artifact's bytes, from whichever study folder holds it."""
        return self._find(artifact_id).open("rb")

    def write(self, artifact_id: str, content_body: BinaryIO) -> None:
        """Stores a file uploaded through the dashboard."""
        from optuna.artifacts import FileSystemArtifactStore

        folder = store_path(self._results, UPLOADS)
        folder.mkdir(parents=True, exist_ok=True)
        FileSystemArtifactStore(folder).write(artifact_id, content_body)

    def remove(self, artifact_id: str) -> None:
        """Deletes the artifact's file."""
        self._find(artifact_id).unlink()


def serve(
    storage_url: str,
    host: str = LOOPBACK,
    port: int = 8080,
    results_dir: Path = Path("results"),
) -> None:
    """Publishes what is missing (:func:`publish_all`), then blocks, serving the dashboard for
    every study in ``storage_url`` with the artifacts under ``results_dir``."""
    from optuna_dashboard import run_server

    publish_all(storage_url, results_dir)
    store = ResultsArtifactStore(results_dir)
    run_server(open_storage(storage_url), host=host, port=port, artifact_store=store)
