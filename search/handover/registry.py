"""``export --mlflow URI``: the bundle logged as an MLflow 3 model, registered and promoted.

After ``export`` writes a bundle (:mod:`search.handover.bundle`), :func:`register_bundle`
reads only that folder and, in the MLflow experiment named after the study:

1. logs a run: params (every knob of ``config.yaml``), metrics (the confirmation's mean, std,
   min and max per objective, the final model's metrics, its learning curve as steps), tags
   (lineage: study, redacted storage, source trial, seeds, git commit, package versions, the
   data declaration and its fingerprint), and the whole bundle under ``bundle/``
   (``MODEL_CARD.md``, ``metrics.json``, ``learning_curves.png``, ``config.yaml``, the
   framework's native weights);
2. logs the model, pickle-free: the served pyfunc around ``model.onnx`` when the bundle has
   one, else TensorFlow's flavor from ``model.keras``; with a signature and an input example from
   ``inputs.json``;
3. registers a new version of the model (default: the study's name), sets ``challenger`` on
   it, tags it with the study, the trial and the confirmed numbers, and with ``--promote``
   moves ``champion`` (:func:`search.handover.promote.promote`);
4. writes ``models:/name/N`` into the bundle's ``metrics.json`` and ``MODEL_CARD.md``.

:func:`preflight` checks the URI, the name and the alias before any confirmation run starts.
MLflow is imported inside the functions: ``--help`` and ``run`` never load it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from search.contract.inputs import read_inputs
from search.errors import SearchError, one_line
from search.handover.mlflow_model import log_model
from search.handover.promote import promote, version_tags
from search.record.storage import expand, redact, scrub
from search.record.study import load_study, stored_spec

if TYPE_CHECKING:
    from collections.abc import Sequence

CHALLENGER = "challenger"
CHAMPION = "champion"
BUNDLE_ARTIFACTS = "bundle"
"""The run's artifact folder that holds the bundle's files."""
TAG = "search."
"""The prefix of every tag this module writes."""


class RegistryError(SearchError):
    """The registry cannot be reached, or refuses a name or an alias."""


@dataclass(frozen=True)
class Target:
    """Where and under which name a bundle is registered."""

    uri: str  # as given (may hold ${VAR}); :attr:`real` expands it
    model_name: str
    alias: str = CHALLENGER
    promote: bool = False

    @property
    def real(self) -> str:
        """The URI with ``${VAR}`` read from the environment."""
        try:
            return expand(self.uri)
        except KeyError as exc:
            raise RegistryError(f"--mlflow: environment variable {exc} is not set") from None

    @property
    def shown(self) -> str:
        """The URI safe to print: any password replaced by ``***``."""
        return redact(self.uri)


def serve_command(model_uri: str, target: Target, port: int = 5001) -> str:
    """The shell line that serves ``model_uri`` with this interpreter's MLflow and uvicorn
    (``mlflow models serve --env-manager local`` runs ``uvicorn`` from ``PATH``: a venv not
    activated lacks it). The registry URI as given: a password stays masked, ``${VAR}`` unread.

    Example:
        >>> line = serve_command("models:/m/2", Target(uri="http://u:pw@host:5000", model_name="m"))
        >>> "MLFLOW_TRACKING_URI='http://u:***@host:5000'" in line and "-m models:/m/2" in line
        True
    """
    import shlex
    import sys

    bin_dir = shlex.quote(str(Path(sys.executable).parent))
    return (
        f'PATH={bin_dir}:"$PATH" MLFLOW_TRACKING_URI={shlex.quote(target.shown)} '
        f"mlflow models serve -m {model_uri} --env-manager local -h 127.0.0.1 -p {port}"
    )


def quiet_client(uri: str) -> Any:
    """An ``MlflowClient`` on ``uri`` that gives up on an unreachable server in seconds and
    prints no URL of its own (MLflow's "View run at" line shows the URI's password; the
    lines of :func:`register_bundle` show it masked).

    MLflow's info lines (a new experiment) and download bars stay off the console, as do
    ``mlflow.onnx``'s warnings: the one it gives on logging, that this machine's onnxruntime
    has no CUDA provider, is about the exporting machine, not the one that will serve it."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # check's download
    for name, level in (("mlflow", logging.WARNING), ("mlflow.onnx", logging.ERROR)):
        logging.getLogger(name).setLevel(level)
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


URI_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


@contextlib.contextmanager
def fluent_on(uri: str) -> Iterator[None]:
    """MLflow's fluent API (``mlflow.start_run``, ``register_model``, ``pyfunc.load_model``)
    on ``uri`` for the block, then as it was before.

    ``mlflow.set_tracking_uri`` also writes ``MLFLOW_TRACKING_URI`` (``set_registry_uri`` its
    own) into ``os.environ``, so without this every process started afterwards would inherit
    the URI, password and all: a notebook's next search and its Ray workers, or an
    ``mlflow models serve`` meant for another registry.

    Example:
        >>> import os
        >>> _ = os.environ.pop("MLFLOW_TRACKING_URI", None)
        >>> with fluent_on("sqlite:////tmp/doctest-mlflow.db"):
        ...     os.environ["MLFLOW_TRACKING_URI"]
        'sqlite:////tmp/doctest-mlflow.db'
        >>> "MLFLOW_TRACKING_URI" in os.environ
        False
    """
    import mlflow

    saved = {name: os.environ.get(name) for name in URI_VARIABLES}
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        # None is MLflow's "not set" (its stubs say str): the variable unset, the default back
        mlflow.set_tracking_uri(saved["MLFLOW_TRACKING_URI"])  # type: ignore[arg-type]
        mlflow.set_registry_uri(saved["MLFLOW_REGISTRY_URI"])  # type: ignore[arg-type]
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)


ALIAS_CHECK = ("_validate_alias_name", "_validate_model_alias_name")
"""MLflow's check of an alias's characters and length, by its names, newest first (MLflow
3.18 renamed ``_validate_model_alias_name``)."""
RESERVED_CHECK = ("_validate_alias_name_reserved", "_validate_model_alias_name_reserved")
"""MLflow's check that an alias is not ``latest`` or a version's (renamed in 3.18 too)."""


def _mlflow_check(validation: Any, *names: str) -> Any:
    """The first of MLflow's private checks ``names`` that its ``validation`` module has;
    without any, none here (the registry still refuses, once the model is logged).

    Example:
        >>> from types import SimpleNamespace
        >>> old = SimpleNamespace(_validate_model_alias_name=len)
        >>> _mlflow_check(old, *ALIAS_CHECK)("champion")
        8
        >>> _mlflow_check(SimpleNamespace(), *ALIAS_CHECK)("champion") is None
        True
    """
    found = next((getattr(validation, n) for n in names if hasattr(validation, n)), None)
    return found or (lambda value: None)


def preflight(target: Target) -> None:
    """Refuses, in one line, a name or alias MLflow would refuse and a registry it cannot
    reach; called before any confirmation run.

    Raises:
        RegistryError: One line, the URI redacted.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.utils import validation

    checks = [
        ("model name", target.model_name, validation._validate_model_name),
        ("alias", target.alias, _mlflow_check(validation, *ALIAS_CHECK)),
        ("alias", target.alias, _mlflow_check(validation, *RESERVED_CHECK)),
    ]
    for what, value, check in checks:
        try:
            check(value)
        except MlflowException as exc:
            raise RegistryError(f"--mlflow: {what} {value!r}: {one_line(exc.message)}") from None
    try:
        quiet_client(target.real).search_registered_models(max_results=1)
    except Exception as exc:  # any failure to reach or read it
        why = one_line(scrub(str(getattr(exc, "message", exc)), target.uri), limit=300)
        raise RegistryError(
            f"--mlflow {target.shown}: cannot use the MLflow registry ({why})"
        ) from None


def data_fingerprint(folder: Path, config: dict[str, Any]) -> str:
    """The bundle's data fingerprint (``metrics.json``'s, :func:`search.handover.lineage.
    data_fingerprint`: the same string as its card and ``environment.txt``); for a bundle that
    records none (its trainable loads its own data), a hash of the data declaration and of
    ``validation.npz``, saying so. Two versions were scored on the same validation data when
    their fingerprints agree."""
    try:
        recorded = json.loads((folder / "metrics.json").read_text()).get("data_fingerprint")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if recorded:
        return str(recorded)
    digest = hashlib.sha256(json.dumps(config.get("data") or {}, sort_keys=True).encode())
    npz = folder / "validation.npz"
    if npz.is_file():
        digest.update(npz.read_bytes())
    return f"sha256:{digest.hexdigest()} (config.yaml's data: and validation.npz)"


def confirmed(metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per objective, the chosen config's confirmed mean, std, min, max and runs."""
    pareto = metrics.get("pareto", {}).get("confirmed")
    if pareto:
        return {k: dict(v) for k, v in pareto.items()}
    trial = metrics["chosen"]["source_trial"]
    row = next(r for r in metrics["confirmation"] if r["source_trial"] == trial)
    ok = row["runs"] - row["failed"]
    return {metrics["objective"]["metric"]: {**row, "ok": ok}}


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    found: dict[str, float] = {}
    for metric, stats in confirmed(metrics).items():
        for stat in ("mean", "std", "min", "max"):
            if isinstance(stats.get(stat), int | float):
                found[f"confirmed.{metric}.{stat}"] = float(stats[stat])
    for key, value in metrics.get("final", {}).items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            found[f"final.{key}"] = float(value)
    return found


def _lineage(folder: Path, metrics: dict[str, Any], config: dict[str, Any]) -> dict[str, str]:
    env = (folder / "environment.txt").read_text() if (folder / "environment.txt").exists() else ""
    tags = {
        "study": metrics["study"],
        "source_trial": str(metrics["chosen"]["source_trial"]),
        "final_seed": str(metrics["chosen"]["seed"]),
        "seeds": ",".join(map(str, metrics.get("seeds", []))),
        "storage": redact(str(config.get("storage", ""))),
        "trainable": metrics.get("trainable", ""),
        "data": json.dumps(config.get("data") or {}, sort_keys=True),
        "data_fingerprint": data_fingerprint(folder, config),
        "confirm_study": metrics.get("confirm_study", ""),
        "frameworks": ", ".join(metrics.get("frameworks") or []),
        "environment": env[:5000],
    }
    for line in env.splitlines():
        if line.startswith("git "):
            tags["git_commit"] = line.removeprefix("git ").strip()
    tags["packages"] = " ".join(line for line in env.splitlines() if "==" in line)
    return {TAG + k: v for k, v in tags.items() if v}


def _read(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        metrics = json.loads((folder / "metrics.json").read_text())
        config = yaml.safe_load((folder / "config.yaml").read_text())
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise RegistryError(f"{folder}: not an export bundle ({one_line(str(exc))})") from None
    return metrics, config


def register_bundles(folders: Sequence[Path], target: Target, log: Any = print) -> list[str]:
    """Registers each bundle (:func:`register_bundle`) as a new version of one model; returns
    their ``models:/name/N``.

    Several bundles are the points of ``export --pareto``, best on the primary objective
    first: each gets its version, tagged with its trial, but only the first takes the alias
    (and is considered for ``champion``): an alias names one version, and moving it point
    after point would leave it on the front's worst on the primary objective.
    """
    rest = replace(target, alias="", promote=False)
    return [
        register_bundle(folder, target if i == 0 else rest, log) for i, folder in enumerate(folders)
    ]


def register_bundle(folder: Path, target: Target, log: Any = print) -> str:
    """Logs, registers and (with ``target.promote``) promotes the bundle in ``folder``
    (module docstring); returns ``models:/name/N``.

    Raises:
        RegistryError: One line, the URI's password masked, when MLflow fails.
    """
    from mlflow.exceptions import MlflowException

    try:
        return _register(folder, target, log)
    except MlflowException as exc:
        why = one_line(scrub(str(exc.message), target.uri), limit=300)
        raise RegistryError(
            f"--mlflow {target.shown}: registering {folder} failed ({why})"
        ) from None


def _register(folder: Path, target: Target, log: Any) -> str:
    metrics, config = _read(folder)
    quiet_client(target.real)
    with fluent_on(target.real):
        return _logged_and_registered(folder, metrics, config, target, log)


def _logged_and_registered(
    folder: Path, metrics: dict[str, Any], config: dict[str, Any], target: Target, log: Any
) -> str:
    import mlflow

    real = target.real
    mlflow.set_experiment(metrics["study"])
    trial = metrics["chosen"]["source_trial"]
    with mlflow.start_run(run_name=f"{metrics['study']}-trial-{trial}") as run:
        mlflow.log_params({k: str(v)[:6000] for k, v in (config.get("fixed") or {}).items()})
        mlflow.log_metrics(_numbers(metrics))
        for step, epoch in enumerate(metrics.get("final_history", []), start=1):
            mlflow.log_metrics({f"curve.{k}": float(v) for k, v in epoch.items()}, step=step)
        tags = _lineage(folder, metrics, config)
        mlflow.set_tags({**tags, TAG + "search_run_id": run.info.run_id})
        info = log_model(folder, read_inputs(folder))
        mlflow.log_artifacts(str(folder), BUNDLE_ARTIFACTS)
    client = quiet_client(real)
    with contextlib.redirect_stderr(io.StringIO()):  # its "Successfully registered": ours below
        version = mlflow.register_model(
            info.model_uri, target.model_name, tags=version_tags(metrics, tags, confirmed(metrics))
        )
    if target.alias:
        client.set_registered_model_alias(target.model_name, target.alias, version.version)
    uri = f"models:/{target.model_name}/{version.version}"
    alias = f" ({target.alias})" if target.alias else ""
    log(f"registered {uri}{alias} in {target.shown}, run {run.info.run_id}")
    if target.shown.startswith(("http://", "https://")):
        page = f"{target.shown.rstrip('/')}/#/models/{target.model_name}/versions/{version.version}"
        log(f"see it at {page}")
    if target.promote:
        promote(client, target.model_name, version.version, log)
    log(f"serve it: {serve_command(uri, target)}")
    _note_in_bundle(folder, metrics, uri, target, run.info.run_id)
    for name in ("metrics.json", "MODEL_CARD.md"):  # the run's copies say it too
        client.log_artifact(run.info.run_id, str(folder / name), BUNDLE_ARTIFACTS)
    return uri


def _note_in_bundle(
    folder: Path, metrics: dict[str, Any], uri: str, target: Target, run_id: str
) -> None:
    """``registered_model`` in ``metrics.json`` and a Registry section in the card."""
    metrics["registered_model"] = {
        "uri": uri,
        "alias": target.alias or None,
        "tracking_uri": target.shown,
        "run_id": run_id,
    }
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
    card = folder / "MODEL_CARD.md"
    text = card.read_text() if card.exists() else ""
    alias = f", alias `{target.alias}`" if target.alias else ""
    card.write_text(
        text.rstrip("\n")
        + f"\n\n## Registry\n\nRegistered in MLflow ({target.shown}) as `{uri}`{alias}, "
        f"run `{run_id}`. Serve it with "
        f"`mlflow models serve -m {uri} --env-manager local -p 5001`.\n"
    )


def target_for(
    study_name: str, storage: str, uri: str | None, model_name: str | None, promote: bool
) -> Target | None:
    """The registry ``export`` writes to: ``--mlflow`` or the spec's ``export.mlflow``; None
    when neither names one."""
    spec = stored_spec(load_study(study_name, storage), storage, find_code=True, required=True)
    declared = spec.export.mlflow if spec.export is not None else None
    if uri is None and declared is None:
        if promote:
            raise RegistryError("--promote: needs --mlflow URI (or export.mlflow in the spec)")
        return None
    return Target(
        uri=uri or declared.tracking_uri,  # type: ignore[union-attr]
        model_name=model_name or (declared.model_name if declared else None) or study_name,
        alias=declared.alias if declared else CHALLENGER,
        promote=promote,
    )
