"""The study's artifact store: files optuna-dashboard shows beside a trial (or the study).

The bytes go to a :class:`~optuna.artifacts.FileSystemArtifactStore` under
``results/<study>/artifacts``, the metadata to the study's storage. Where the metadata goes:
:func:`optuna.artifacts.upload_artifact` writes it to the trial's system attributes, which
Optuna refuses for a finished trial (``UpdateFinishedTrialError``), and only the driver writes
to a running one. So the metadata of a trial's artifact goes to the study's system attributes
under optuna-dashboard's own key for trial artifacts (``dashboard:artifacts:<trial_id>:<id>``),
which its artifact tab and its ``/artifacts/<study_id>/<trial_id>/<artifact_id>`` route read;
the study's own artifacts use Optuna's key.

What is stored here: the learning curves and model cards (:mod:`search.report.artifacts`) and
each finished trial's output (:func:`attach_tail`, called by the run as each trial ends).
"""

from __future__ import annotations

import io
import json
import mimetypes
import uuid
from collections import defaultdict
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from search.record.folders import safe_name, study_folder

if TYPE_CHECKING:
    import optuna

ARTIFACTS_DIR = "artifacts"
ATTR_PREFIX = "artifacts:"
"""Optuna's key prefix for an artifact's metadata (a study's own artifacts here)."""
TRIAL_PREFIX = "dashboard:artifacts:"
"""optuna-dashboard's key prefix, on the study, for a trial's artifact: ``<trial_id>:<id>``."""
TAIL_BYTES = 1 << 20
"""The most of a trial's output file that becomes its artifact: the end of it (1 MiB)."""


def store_path(results_dir: Path, study_name: str) -> Path:
    """The artifact folder of ``study_name``: ``results_dir/<study>/artifacts``."""
    return study_folder(results_dir, study_name) / ARTIFACTS_DIR


def made(folder: Path) -> Path:
    """``folder``, created if it is not there."""
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def attached(study: optuna.Study) -> dict[int | None, dict[str, str]]:
    """The artifacts ``study`` has: by trial id (``None``: the study's own), each file name
    mapped to its artifact id; from the study's system attributes and the trials' own."""
    found: dict[int | None, dict[str, str]] = defaultdict(dict)
    attrs = study._storage.get_study_system_attrs(study._study_id)
    for key, raw in attrs.items():
        if key.startswith(TRIAL_PREFIX):
            _add(found[int(key[len(TRIAL_PREFIX) :].split(":")[0])], raw)
        elif key.startswith(ATTR_PREFIX):
            _add(found[None], raw)
    for trial in study.get_trials(deepcopy=False):
        for key, raw in trial.system_attrs.items():
            if key.startswith(ATTR_PREFIX):  # optuna.artifacts.upload_artifact while it ran
                _add(found[trial._trial_id], raw)
    return found


def _add(names: dict[str, str], raw: Any) -> None:
    meta = json.loads(raw) if isinstance(raw, str) else None
    if isinstance(meta, dict):  # the dashboard marks a deleted artifact with null
        artifact_id = str(meta.get("artifact_id"))
        if safe_name(artifact_id):  # it becomes a file name in the store: never a path
            names[str(meta.get("filename"))] = artifact_id


def upload(
    study: optuna.Study,
    store: Any,
    body: IO[bytes],
    name: str,
    trial_id: int | None,
    artifact_id: str | None = None,
    mimetype: str | None = None,
) -> str:
    """Writes ``body`` to ``store`` under ``artifact_id`` (metadata already recorded), or
    under a new id whose metadata (file ``name``, ``mimetype`` or the one its name suggests)
    it then records on the study; returns the id."""
    if artifact_id is not None:
        store.write(artifact_id, body)
        return artifact_id
    artifact_id = str(uuid.uuid4())
    guessed, encoding = mimetypes.guess_type(name)
    meta = {
        "artifact_id": artifact_id,
        "filename": name,
        "mimetype": mimetype or guessed or "application/octet-stream",
        "encoding": encoding,
    }
    store.write(artifact_id, body)  # the file first: a listed artifact always has its bytes
    key = ATTR_PREFIX if trial_id is None else f"{TRIAL_PREFIX}{trial_id}:"
    study._storage.set_study_system_attr(study._study_id, key + artifact_id, json.dumps(meta))
    return artifact_id


def tail(path: Path, limit: int = TAIL_BYTES) -> bytes:
    """The end of ``path``: all of it when it holds at most ``limit`` bytes, else its last
    ``limit`` bytes from the first whole line, after a line that says how much was left out.

    Example:
        >>> import tempfile
        >>> log = Path(tempfile.mkdtemp()) / "output.log"
        >>> _ = log.write_bytes(b"one\\ntwo\\nthree\\n")
        >>> tail(log, 8).decode()
        '[first 8 bytes left out]\\nthree\\n'
    """
    size = path.stat().st_size
    with path.open("rb") as file:
        if size <= limit:
            return file.read()
        file.seek(size - limit)
        end = file.read()
    cut = end.find(b"\n") + 1 if b"\n" in end[:-1] else 0
    return f"[first {size - limit + cut} bytes left out]\n".encode() + end[cut:]


def attach_tail(
    study: optuna.Study,
    trial_id: int,
    path: Path,
    name: str,
    results_dir: Path,
    limit: int = TAIL_BYTES,
) -> str:
    """Attaches the end of the text file ``path`` (:func:`tail`) to the trial as ``name``,
    a new artifact (a trial's output is attached once, when it ends); returns its id."""
    from optuna.artifacts import FileSystemArtifactStore

    store = FileSystemArtifactStore(made(store_path(results_dir, study.study_name)))
    body = io.BytesIO(tail(path, limit))
    return upload(study, store, body, name, trial_id, mimetype="text/plain")
