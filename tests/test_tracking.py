"""``tracking: {mlflow: URI}``: the search itself in MLflow, written behind the study.

The write-behind thread is driven by fakes (a writer that cannot connect, one that comes back,
one that refuses a write); real studies on a local Ray are tracked into MLflow's SQLite store
(the child runs must mirror the Optuna record, and a resume continue the same parent run) and
into a real ``mlflow server`` that is killed mid-study or never there: the study finishes, its
record whole, and one line says what was not logged, the URI's password masked everywhere.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from search.record.queries import EPOCHS_FILE, read_epochs
from search.record.study import load_study
from search.record.tracking import tracker as tracking
from search.record.tracking.mlflow_runs import PARENT, STATUS, TrialRun
from search.record.tracking.tracker import ATTEMPTS, Tracker
from search.specs.schema import parse_spec
from search.tuning.runner import RunOptions, run_study
from tests.helpers import GATED_FAULTS, MLFLOW_SERVER_ENV, base_spec, run_spec, write_spec

SECRET = "s3cret"
LINE = "MLflow tracking:"


class FakeWriter:
    """Records every call; fails with ``errors`` (one per call, ``None``: succeed)."""

    def __init__(self, errors: list[BaseException | None] = (), refuse: int | None = None) -> None:
        self.errors = list(errors)
        self.refuse = refuse  # a trial number it refuses every time
        self.calls: list[str] = []
        self.done: list[str] = []

    def _call(self, what: str) -> None:
        self.calls.append(what)
        error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error
        self.done.append(what)

    def open(self) -> None:
        self._call("open")

    def logged(self, number: int) -> bool:
        return f"trial {number}" in self.done

    def write(self, run: TrialRun) -> None:
        if run.number == self.refuse:
            self.calls.append(f"trial {run.number}")
            raise ValueError(f"INVALID_PARAMETER_VALUE for http://bob:{SECRET}@h:1")
        self._call(f"trial {run.number}")

    def close(self, status: str = "FINISHED") -> None:
        self._call(f"close {status}")


def _runs(*numbers: int) -> list[TrialRun]:
    return [TrialRun(n, "COMPLETE", {"x": n / 10}, {1: {"acc": 0.5}}) for n in numbers]


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking, "PAUSES_S", (0.01,))


def test_a_server_that_never_answers_costs_the_study_nothing_and_one_line(quick: None) -> None:
    down = requests.ConnectionError("Connection refused")
    writer = FakeWriter([down] * 1000)
    tracker = Tracker(writer, f"http://bob:{SECRET}@127.0.0.1:1")
    for run in _runs(0, 1, 2):
        tracker.trial(run)  # returns at once: the writes wait behind
    line = tracker.close()
    assert line == (
        "MLflow tracking: 5 of 5 writes not logged, trials 0-2 among them "
        "(server http://bob:***@127.0.0.1:1 unreachable)"
    )
    assert writer.done == []


def test_writes_wait_while_the_server_is_away_and_are_logged_when_it_returns(quick: None) -> None:
    down = requests.ConnectionError("Connection refused")
    writer = FakeWriter([down] * 6)  # six failed tries in a row: more than ATTEMPTS
    tracker = Tracker(writer, "http://127.0.0.1:1")
    for run in _runs(0, 1):
        tracker.trial(run)
    deadline = time.monotonic() + 30
    while "trial 1" not in writer.done and time.monotonic() < deadline:  # the run goes on
        time.sleep(0.01)
    assert tracker.close("KILLED") == "MLflow tracking: 4 writes logged to http://127.0.0.1:1"
    assert writer.done == ["open", "trial 0", "trial 1", "close KILLED"]  # in order, once each


def test_a_refused_write_is_tried_a_few_times_then_given_up_and_the_rest_go_on(
    quick: None,
) -> None:
    writer = FakeWriter(refuse=1)
    tracker = Tracker(writer, "http://127.0.0.1:1")
    for run in _runs(0, 1, 2):
        tracker.trial(run)
    line = tracker.close()
    assert writer.calls.count("trial 1") == ATTEMPTS
    assert writer.done == ["open", "trial 0", "trial 2", "close FINISHED"]
    assert line.startswith("MLflow tracking: 1 of 5 writes not logged, trials 1 among them (")
    assert "INVALID_PARAMETER_VALUE" in line and SECRET not in line


def test_earlier_trials_not_logged_yet_go_first_once_the_parent_run_is_open(quick: None) -> None:
    writer = FakeWriter()
    asked: list[list[int]] = []

    def backlog(logged: Any) -> list[TrialRun]:
        asked.append([n for n in (0, 1, 2) if not logged(n)])
        return _runs(*asked[-1])

    tracker = Tracker(writer, "sqlite:///m.db", backlog)
    tracker.trial(_runs(3)[0])
    assert tracker.close() == "MLflow tracking: 6 writes logged to sqlite:///m.db"
    assert writer.done == ["open", "trial 0", "trial 1", "trial 2", "trial 3", "close FINISHED"]
    assert asked == [[0, 1, 2]]


def test_a_tracking_uri_mlflow_cannot_use_or_that_names_an_unset_variable_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from search.errors import SpecError
    from search.tuning.preflight import PreflightError, check_tracking

    with pytest.raises(SpecError) as bad:
        parse_spec(base_spec(tmp_path, tracking={"mlflow": f"ftp://bob:{SECRET}@h/x"}), "s.yaml")
    assert str(bad.value).startswith("s.yaml: tracking.mlflow: expected an http(s):// MLflow")
    assert SECRET not in str(bad.value) and "\n" not in str(bad.value)
    monkeypatch.delenv("NO_SUCH_PW", raising=False)
    spec = parse_spec(base_spec(tmp_path, tracking={"mlflow": "http://bob:${NO_SUCH_PW}@h:1"}))
    with pytest.raises(PreflightError, match="tracking.mlflow: environment variable NO_SUCH_PW"):
        check_tracking(spec)


# --- real studies ---------------------------------------------------------------------------

FLAKY = {"x": 0.9, "lr": 0.1, "fail_once_at": 2}  # fails once at epoch 2, retried: one run
EXPLODES = {"x": 0.5, "lr": 1.4, "fail_once_at": 0}  # its loss turns NaN at epoch 2: FAIL


def _mlflow_client(uri: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _children(client: Any, study: str) -> tuple[Any, dict[int, Any]]:
    experiment = client.get_experiment_by_name(study)
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = [r for r in runs if PARENT not in r.data.tags]
    assert len(parents) == 1, "one parent run per study, a resume included"
    children = [r for r in runs if PARENT in r.data.tags]
    numbers = [int(r.data.tags["search.trial_number"]) for r in children]
    assert len(set(numbers)) == len(numbers), "one child run per trial"
    assert all(r.data.tags[PARENT] == parents[0].info.run_id for r in children)
    return parents[0], {int(r.data.tags["search.trial_number"]): r for r in children}


@pytest.fixture(scope="module")
def tracked(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """A study tracked into MLflow's SQLite store, run for 6 trials, then resumed to 8."""
    tmp = tmp_path_factory.mktemp("tracked")
    data = base_spec(
        tmp,
        study="tracked",
        budget={"trials": 6, "max_epochs": 4},
        asha={"grace_period": 2, "reduction_factor": 2},  # one rung, at epoch 2
        sampler={"name": "random", "seed": 129, "start_from": [FLAKY, EXPLODES]},
        space={
            "x": {"uniform": [0.0, 1.0]},
            "lr": {"loguniform": [0.05, 1.5]},
            "fail_once_at": {"choice": [0, 2]},
        },
        faults={"max_failures": 1, "checkpoint_every_s": 0},
        tracking={"mlflow": f"sqlite:///{tmp}/mlflow.db"},
    )
    options = RunOptions(results_dir=tmp / "results", progress=False)
    first = run_study(parse_spec(data), options)
    resumed = run_study(parse_spec({**data, "budget": {"trials": 8, "max_epochs": 4}}), options)
    return data, first, resumed, tmp


def test_each_trial_is_one_child_run_that_mirrors_the_optuna_record(tracked: tuple) -> None:
    data, _, _, tmp = tracked
    study = load_study("tracked", data["storage"])
    client = _mlflow_client(data["tracking"]["mlflow"])
    parent, children = _children(client, "tracked")
    assert sorted(children) == [t.number for t in study.trials] == list(range(8))
    states = Counter(t.state.name for t in study.trials)
    shown = [(t.number, t.state.name, t.user_attrs) for t in study.trials]
    assert states["COMPLETE"] and states["PRUNED"] and states["FAIL"], shown
    assert study.trials[0].user_attrs["retries"] == 1  # retried from its checkpoint
    table = read_epochs(tmp / "results" / "tracked" / EPOCHS_FILE)
    for trial in study.trials:
        run = children[trial.number]
        assert run.data.params == {k: str(v) for k, v in trial.params.items()}
        assert run.info.status == STATUS[trial.state.name]
        assert run.data.tags["search.state"] == trial.state.name
        assert run.data.tags.get("search.fail_reason") == trial.user_attrs.get("fail_reason")
        epochs = trial.user_attrs["epochs"]
        pruned_at = run.data.tags.get("search.pruned_at_epoch")
        assert pruned_at == (str(epochs) if trial.state.name == "PRUNED" else None)
        for metric, curve in table[trial.number].items():
            history = client.get_metric_history(run.info.run_id, metric)
            got = {m.step: m.value for m in history}
            assert len(history) == len(curve) == epochs
            assert got.keys() == curve.keys()
            assert all(got[e] == v or (v != v and got[e] != got[e]) for e, v in curve.items())
        objective = client.get_metric_history(run.info.run_id, "val_accuracy")
        assert {m.step: m.value for m in objective} == trial.intermediate_values
    assert study.trials[1].user_attrs["fail_reason"] == "val_loss is nan at epoch 2"


def test_a_resumed_study_continues_its_parent_run_and_says_what_it_logged(tracked: tuple) -> None:
    data, first, resumed, _ = tracked
    parent, _ = _children(_mlflow_client(data["tracking"]["mlflow"]), "tracked")
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["search.study"] == "tracked"
    assert parent.data.tags["search.budget_trials"] == "8"  # the resumed run's spec
    assert parent.data.params["objective"] == "val_accuracy max"
    uri = data["tracking"]["mlflow"]
    assert first.tracking == f"MLflow tracking: 8 writes logged to {uri}"  # open, 6, close
    assert resumed.tracking == f"MLflow tracking: 4 writes logged to {uri}"


# --- a server that dies, or is never there ---------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def killable_mlflow_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real ``mlflow server`` on 127.0.0.1 (SQLite store), its process group killable: the
    test that kills it has one of its own, not the session's (tests/conftest.py)."""
    root = tmp_path / "server"
    root.mkdir()
    port = _free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--backend-store-uri", f"sqlite:///{root}/mlflow.db", "--workers", "1"]
    cmd += ["--artifacts-destination", str(root / "artifacts")]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env |= MLFLOW_SERVER_ENV
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: requests.get(f"{url}/health", timeout=2).status_code == 200, proc, 300)
        yield url, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def _wait(ready: Any, proc: subprocess.Popen[bytes] | None = None, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            if ready():
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"not ready in {seconds} s")


def _finished_children(url: str, study: str) -> int:
    """How many child runs of ``study`` the server holds ended (read with its REST API)."""
    api = f"{url}/api/2.0/mlflow"
    got = requests.get(f"{api}/experiments/get-by-name", {"experiment_name": study}, timeout=2)
    if got.status_code != 200:
        return 0
    body = {"experiment_ids": [got.json()["experiment"]["experiment_id"]], "max_results": 100}
    runs = requests.post(f"{api}/runs/search", json=body, timeout=2).json().get("runs", [])
    return sum(
        r["info"]["status"] != "RUNNING"
        and any(t["key"] == PARENT for t in r["data"].get("tags", []))
        for r in runs
    )


def _no_secret_under(folder: Path) -> None:
    """No file the run wrote (the study, results, Ray's folders) holds the password: only the
    spec the user wrote, and the server's own folder, are left out."""
    for path in folder.rglob("*"):
        if path.is_file() and "server" not in path.parts and path.name != "spec.yaml":
            assert SECRET.encode() not in path.read_bytes(), path


def _tracked_run(tmp: Path, uri: str, trials: int, **fixed: Any) -> Path:
    data = base_spec(
        tmp,
        study="behind",
        budget={"trials": trials, "max_epochs": 2},
        asha={"enabled": False},
        fixed=fixed,
        tracking={"mlflow": uri},
    )
    if "hold_file" in fixed:
        data["faults"] = GATED_FAULTS
    return write_spec(tmp / "spec.yaml", data)


@pytest.mark.usefixtures("joins_session_ray")
def test_a_server_killed_mid_study_loses_writes_not_the_study(
    tmp_path: Path, killable_mlflow_server: tuple[str, subprocess.Popen[bytes]]
) -> None:
    url, server = killable_mlflow_server
    gate = tmp_path / "gate"
    uri = url.replace("http://", f"http://bob:{SECRET}@")  # a server without auth ignores it
    spec = _tracked_run(tmp_path, uri, 5, hold_file=str(gate), hold_from=2)
    driver = subprocess.Popen(
        [sys.executable, "-m", "search", "run", str(spec), "--results", str(tmp_path / "r")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        _wait(lambda: _finished_children(url, "behind") >= 2, seconds=180)  # trials 0 and 1
        os.killpg(server.pid, signal.SIGKILL)  # trials 2-4 end after the server is gone
        server.wait()
        gate.touch()
        out, _ = driver.communicate(timeout=240)
    finally:
        gate.touch()
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, out
    study = load_study("behind", f"sqlite:///{tmp_path}/optuna.db")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 5
    lines = [line for line in out.splitlines() if line.startswith(LINE)]
    shown = uri.replace(SECRET, "***")
    assert lines == [
        f"{LINE} 4 of 7 writes not logged, trials 2-4 among them (server {shown} unreachable)"
    ]
    assert SECRET not in out
    _no_secret_under(tmp_path)


@pytest.mark.usefixtures("joins_session_ray")
def test_a_server_never_there_lets_the_study_run_and_says_so_once(tmp_path: Path) -> None:
    uri = f"http://bob:{SECRET}@127.0.0.1:{_free_port()}"
    done = run_spec(_tracked_run(tmp_path, uri, 3), timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    study = load_study("behind", f"sqlite:///{tmp_path}/optuna.db")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    out = done.stdout + done.stderr
    lines = [line for line in out.splitlines() if line.startswith(LINE)]
    shown = uri.replace(SECRET, "***")
    assert lines == [
        f"{LINE} 5 of 5 writes not logged, trials 0-2 among them (server {shown} unreachable)"
    ]
    assert SECRET not in out
    _no_secret_under(tmp_path)
