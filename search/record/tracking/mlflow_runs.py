"""The study as MLflow runs: one parent run for the study, one child run per Optuna trial.

What a trial becomes is decided here, from the driver's own record of it (its Optuna number,
state, parameters, user attributes and per-epoch metrics): a child run keyed by the tag
:data:`TRIAL_NUMBER`, its parameters, every metric per epoch (``step`` = epoch) and its true
state, COMPLETE as ``FINISHED``, PRUNED as ``KILLED`` with the epoch it was stopped at, FAIL as
``FAILED`` with its reason. The parent run is found again by :data:`STUDY_KEY` (kept on the
Optuna study), so a resumed study continues the same parent run, and a trial already logged is
never logged twice.

:class:`StudyRuns` makes the client calls, from one thread only
(:mod:`search.record.tracking.tracker`).
MLflow is imported inside its methods: a run without ``tracking`` never loads it.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from search.record.storage import expand

if TYPE_CHECKING:
    import optuna

TAG = "search."
"""The prefix of every tag this module writes."""
STUDY = TAG + "study"
STUDY_KEY = TAG + "study_key"
TRIAL_NUMBER = TAG + "trial_number"
STATE = TAG + "state"
FAIL_REASON = TAG + "fail_reason"
PRUNED_AT = TAG + "pruned_at_epoch"
STOPPED_BY = TAG + "stopped_by"
RETRIES = TAG + "retries"
EPOCHS = TAG + "epochs"
KEY_ATTR = "search:tracking_key"
"""Study system attribute: the key of the study's parent run (a new study, even one of the
same name after ``--restart``, gets a new parent run)."""
PARENT = "mlflow.parentRunId"
RUN_NAME = "mlflow.runName"
STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}
"""MLflow's run status for each final Optuna state."""
TAG_CHARS = 5000
"""Tag values are cut to this length (MLflow refuses longer ones)."""
BATCH = 1000
"""Metrics per ``log_batch`` call (MLflow's limit; parameters and tags go 100 at a time)."""


@dataclass(frozen=True)
class TrialRun:
    """One finished trial, as the driver recorded it.

    Args:
        number: The Optuna trial number.
        state: ``COMPLETE``, ``PRUNED`` or ``FAIL``.
        params: The trial's sampled parameters.
        metrics: Every numeric metric it yielded, per epoch.
        attrs: Its Optuna user attributes (``fail_reason``, ``epochs``, ``stopped_by``,
            ``retries``, ``seconds``).
        end_ms: When it ended (milliseconds since the epoch).
    """

    number: int
    state: str
    params: Mapping[str, Any]
    metrics: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    attrs: Mapping[str, Any] = field(default_factory=dict)
    end_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    @property
    def start_ms(self) -> int:
        """When it started: its end less the seconds it trained."""
        seconds = self.attrs.get("seconds")
        trained = float(seconds) if isinstance(seconds, int | float) else 0.0
        return self.end_ms - int(trained * 1000)


def child_tags(run: TrialRun) -> dict[str, str]:
    """The tags of a trial's child run: its number, state, epochs and why it ended early.

    Example:
        >>> run = TrialRun(4, "PRUNED", {"x": 0.5}, {1: {"acc": 0.2}}, {"epochs": 1})
        >>> child_tags(run)[PRUNED_AT]
        '1'
        >>> child_tags(TrialRun(5, "FAIL", {}, attrs={"fail_reason": "loss is nan"}))[FAIL_REASON]
        'loss is nan'
    """
    epochs = run.attrs.get("epochs", max(run.metrics, default=0))
    tags = {
        RUN_NAME: f"trial {run.number}",
        TRIAL_NUMBER: str(run.number),
        STATE: run.state,
        EPOCHS: str(epochs),
    }
    if run.state == "PRUNED":
        tags[PRUNED_AT] = str(epochs)
    for key, name in ((FAIL_REASON, "fail_reason"), (STOPPED_BY, "stopped_by")):
        if run.attrs.get(name):
            tags[key] = str(run.attrs[name])[:TAG_CHARS]
    if run.attrs.get("retries"):
        tags[RETRIES] = str(run.attrs["retries"])
    return tags


def study_key(study: optuna.Study) -> str:
    """The key of ``study``'s parent run, created (and stored on the study) the first time."""
    storage, study_id = study._storage, study._study_id
    key = storage.get_study_system_attrs(study_id).get(KEY_ATTR)
    if not isinstance(key, str):
        key = uuid.uuid4().hex
        storage.set_study_system_attr(study_id, KEY_ATTR, key)
    return key


def is_folder(uri: str) -> bool:
    """Whether the tracking URI names a local folder (MLflow's file store)."""
    return "://" not in uri or uri.startswith("file:")


class StudyRuns:
    """The study's parent run and its trials' child runs in one MLflow experiment.

    Args:
        uri: The tracking URI as given (``${VAR}`` read from the environment when used).
        experiment: The experiment's name (the study's).
        key: The parent run's key (:func:`study_key`).
        tags: The parent run's tags (updated on a resume).
        params: The parent run's parameters (the same on a resume: what the study means).
    """

    def __init__(
        self,
        uri: str,
        experiment: str,
        key: str,
        tags: Mapping[str, str],
        params: Mapping[str, Any],
    ) -> None:
        self._uri, self._experiment, self._key = uri, experiment, key
        self._tags = {RUN_NAME: experiment, STUDY: experiment, STUDY_KEY: key, **tags}
        self._params = dict(params)
        self._client: Any = None
        self._experiment_id = ""
        self.parent: str | None = None
        """The parent run's id, once opened."""
        self._children: dict[int, tuple[str, str]] = {}  # number -> (run id, status)
        self._batches: dict[int, int] = {}  # number -> batches already logged

    def open(self) -> None:
        """Finds or creates the experiment and the parent run (RUNNING again on a resume), and
        learns which trials have child runs already."""
        client = self._connect()
        found = client.get_experiment_by_name(self._experiment)
        self._experiment_id = (
            found.experiment_id if found else client.create_experiment(self._experiment)
        )
        runs = self._runs()
        parent = next((r for r in runs if PARENT not in r.data.tags), None)
        if parent is None:
            run_id = client.create_run(self._experiment_id, tags=self._tags).info.run_id
        else:
            run_id = parent.info.run_id
            client.update_run(run_id, status="RUNNING")
        self._log(run_id, params=self._params, tags=self._tags)
        self.parent = run_id
        for run in runs:
            number = run.data.tags.get(TRIAL_NUMBER)
            if run.data.tags.get(PARENT) == run_id and number is not None:
                self._children[int(number)] = (run.info.run_id, run.info.status)

    def _runs(self) -> list[Any]:
        """Every run of this study's key: the parent and its children, page by page."""
        runs: list[Any] = []
        token = None
        while True:
            page = self._client.search_runs(
                [self._experiment_id],
                f"tags.`{STUDY_KEY}` = '{self._key}'",
                max_results=1000,
                page_token=token,
            )
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def logged(self, number: int) -> bool:
        """Whether trial ``number`` has its finished child run already."""
        return self._children.get(number, ("", "RUNNING"))[1] != "RUNNING"

    def write(self, run: TrialRun) -> None:
        """Logs one trial as a child run (its own again when an earlier write was cut short)."""
        if self.parent is None:
            self.open()
        if self.logged(run.number):
            return
        client = self._client
        tags = child_tags(run)
        if run.number not in self._children:
            created = client.create_run(
                self._experiment_id,
                start_time=run.start_ms,
                tags={**tags, PARENT: self.parent, STUDY_KEY: self._key},
            )
            self._children[run.number] = (created.info.run_id, "RUNNING")
        run_id = self._children[run.number][0]
        self._log(run_id, run.params, tags, run.metrics, key=run.number)
        status = STATUS.get(run.state, "FAILED")
        client.set_terminated(run_id, status=status, end_time=run.end_ms)
        self._children[run.number] = (run_id, status)

    def close(self, status: str = "FINISHED") -> None:
        """Ends the parent run with ``status``."""
        if self.parent is None:
            self.open()
        self._client.set_terminated(self.parent, status=status)

    def _connect(self) -> Any:
        """The client, with short timeouts: a dead server costs seconds, not minutes."""
        if self._client is None:
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
            # MLflow prints each ended run's link, the URI's password and all, to stdout
            os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
            if is_folder(self._uri):  # MLflow 3 keeps its file store behind a switch
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            from mlflow import MlflowClient

            for name in ("mlflow", "alembic"):  # MLflow's chatter stays off the run's console
                logging.getLogger(name).setLevel(logging.WARNING)
            self._client = MlflowClient(tracking_uri=expand(self._uri))
        return self._client

    def _log(
        self,
        run_id: str,
        params: Mapping[str, Any] = {},
        tags: Mapping[str, str] = {},
        metrics: Mapping[int, Mapping[str, float]] = {},
        key: int | None = None,
    ) -> None:
        """``log_batch`` calls, at most :data:`BATCH` entries each; with ``key``, the batches
        logged before a failure are not logged again."""
        for index, (p, t, m) in enumerate(batches(params, tags, metrics)):
            if key is not None and index < self._batches.get(key, 0):
                continue
            self._client.log_batch(run_id, metrics=m, params=p, tags=t, synchronous=True)
            if key is not None:
                self._batches[key] = index + 1


def batches(
    params: Mapping[str, Any],
    tags: Mapping[str, str],
    metrics: Mapping[int, Mapping[str, float]],
) -> list[tuple[list[Any], list[Any], list[Any]]]:
    """``(params, tags, metrics)`` entities in groups MLflow takes in one ``log_batch``:
    100 parameters, 100 tags and :data:`BATCH` metrics at most (``step`` = epoch).

    Example:
        >>> [tuple(map(len, b)) for b in batches({"lr": 0.1}, {}, {1: {"a": 0.5}, 2: {"a": 0.6}})]
        [(1, 0, 2)]
    """
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    p = [Param(k, str(v)[:TAG_CHARS]) for k, v in params.items()]
    t = [RunTag(k, str(v)[:TAG_CHARS]) for k, v in tags.items()]
    m = [
        Metric(name, float(value), now, int(epoch))
        for epoch in sorted(metrics)
        for name, value in sorted(metrics[epoch].items())
    ]
    count = max(1, -(-len(p) // 100), -(-len(t) // 100), -(-len(m) // BATCH))
    return [
        (p[i * 100 : (i + 1) * 100], t[i * 100 : (i + 1) * 100], m[i * BATCH : (i + 1) * BATCH])
        for i in range(count)
    ]
