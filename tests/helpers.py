"""What the test files share, in one place: paths, spec writers, the ``python -m search``
processes, small servers' plumbing, studies built directly in their storage, the tabular
model of the bundle checks. Fixtures (a session's Ray, servers) are in ``tests/conftest.py``.

A test file imports from here (``from tests.helpers import ...``), never from another test
file or from ``conftest``. Nothing here imports PyTorch or TensorFlow at import time."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from search.contract.inputs import write_inputs
from search.record.study import open_study, record_spec
from search.specs.schema import parse_spec

REPO = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------- specs and the CLI


def run_spec(spec: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m search run SPEC`` in a subprocess, results beside the spec."""
    return subprocess.run(
        [sys.executable, "-m", "search", "run", str(spec), "--results", str(spec.parent / "r")],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def start_run(
    spec: Path,
    *extra: str,
    prefix: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    stdout: int = subprocess.PIPE,
) -> subprocess.Popen[str]:
    """``python -m search run SPEC --results DIR EXTRA`` started in a session of its own (so
    ``os.killpg`` reaches its group), results beside the spec, after ``prefix`` (``unshare``).
    Its output comes as text: stdout and stderr together on ``stdout``, or with ``stdout`` set
    to ``subprocess.DEVNULL`` only stderr, on ``stderr``."""
    command = [
        sys.executable,
        "-m",
        "search",
        "run",
        str(spec),
        "--results",
        str(spec.parent / "r"),
    ]
    stderr = subprocess.STDOUT if stdout == subprocess.PIPE else subprocess.PIPE
    return subprocess.Popen(
        [*prefix, *command, *extra], cwd=REPO, stdout=stdout, stderr=stderr, text=True,
        start_new_session=True, env=env,
    )  # fmt: skip


def write_spec(path: Path, data: dict[str, Any]) -> Path:
    """Writes ``data`` as a YAML spec file and returns its path."""
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


GATED_FAULTS: dict[str, Any] = {"stall_s": 900}
"""``faults`` of a study whose trials wait at a test's gate (the ``curve`` trainable's
``hold_file``): the wait is a silence that the stall rule (``stall_s: auto``) rightly calls a
hang after 60 s, and a gate may stay shut longer than that on a slow hour."""


def base_spec(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    """A small valid spec on the synthetic ``curve`` trainable, storage under ``tmp_path``."""
    spec: dict[str, Any] = {
        "study": "t",
        "trainable": "search.testing:curve",
        "objective": {"metric": "val_accuracy", "mode": "max"},
        "budget": {"trials": 4, "max_epochs": 3},
        "sampler": {"name": "random", "seed": 0},
        "storage": f"sqlite:///{tmp_path}/optuna.db",
        "space": {"x": {"uniform": [0.0, 1.0]}},
    }
    spec.update(changes)
    return spec


def fused_spec(tmp_path: Path, resources: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A small ``torch_cnn`` study on the digits whose knobs all fuse (the shape fixed, ``lr``
    and ``clip_norm`` searched), with ``resources`` beside ``cpus_per_trial: 1``."""
    spec = base_spec(
        tmp_path,
        study="fused",
        trainable="torch_cnn",
        data={"name": "digits", "val_fraction": 0.2},
        budget={"trials": 8, "max_epochs": 2},
        asha={"grace_period": 1, "reduction_factor": 2},
        resources={"cpus_per_trial": 1, **resources},
        fixed={"channels": 4, "batch_size": 64, "optimizer": "adam"},
        space={"lr": {"loguniform": [1e-3, 3e-2]}, "clip_norm": {"choice": [0.0, 1.0]}},
    )
    spec.update(changes)
    return spec


def deadline_after_first_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's time limit passes only once its clock has run out *and* a trial has reported
    an epoch: a test of what a time limit records then sees a trial cut mid-run whatever the
    machine's load (on a loaded machine, Ray's workers can take the whole limit to start, and
    every trial would end before its first epoch). The limit itself stays the real clock's.
    """
    from search.tuning.stopping import RunStopper

    clock = RunStopper.expired.fget
    assert clock is not None
    monkeypatch.setattr(RunStopper, "expired", property(lambda s: clock(s) and bool(s._seen)))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], seconds: float = 300) -> None:
    """Returns once ``url`` answers 200; raises when ``proc`` exits or ``seconds`` pass (a
    guard for a machine many tests share: a server there can take minutes to start)."""
    import requests

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer in {seconds} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stops ``proc``'s process group (started with ``start_new_session``)."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


TF_NOISE = ("absl::InitializeLog", "cudart_stub", "cuInit", "oneDNN", "cpu_feature_guard")
"""TensorFlow's start-up lines (absl's, CUDA's, a ``cuInit`` error on a host without a GPU,
oneDNN's): none reaches the console of a command (``search.compute.quiet``)."""

MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
"""What an ``mlflow server`` of the tests runs with: no job execution, so it starts no Huey job
runner and consumers (eight Python processes beside the server, importing MLflow each, that
no test uses: the registry and tracking answer alike without them)."""


def venv_path() -> str:
    """``PATH`` with this interpreter's folder first, as in an activated venv (MLflow's
    scoring server is the venv's ``uvicorn``)."""
    return f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


@contextlib.contextmanager
def served(model_uri: str, tracking_uri: str, log_dir: Path) -> Iterator[str]:
    """``mlflow models serve -m MODEL_URI --env-manager local`` on 127.0.0.1 and a free port,
    as the README shows it; yields its base URL once ``/ping`` answers."""
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "PATH": venv_path()}
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri]
    cmd += ["--env-manager", "local", "-p", str(port), "-h", "127.0.0.1"]
    with _serving(cmd, env, port, log_dir) as url:
        yield url


@contextlib.contextmanager
def served_line(line: str, log_dir: Path) -> Iterator[str]:
    """The shell line ``register`` prints (``serve it: ...``), run by ``bash`` as a user pastes
    it, from a shell whose ``PATH`` has no venv and no ``MLFLOW_TRACKING_URI``; only its port
    becomes a free one. Yields the base URL once ``/ping`` answers."""
    port = free_port()
    assert line.endswith(" -p 5001"), line
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "VIRTUAL_ENV"))}
    env["PATH"] = "/usr/bin:/bin"
    cmd = ["bash", "-c", line.removesuffix("5001") + str(port)]
    with _serving(cmd, env, port, log_dir) as url:
        yield url


@contextlib.contextmanager
def _serving(cmd: list[str], env: dict[str, str], port: int, log_dir: Path) -> Iterator[str]:
    log = (log_dir / "serve.log").open("wb")
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/ping", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def answers(base_url: str, inputs: dict[str, np.ndarray]) -> tuple[list[Any], np.ndarray]:
    """The labels and the logits a scoring server answers for ``inputs`` (raw rows)."""
    import requests

    body = {"inputs": {k: v.tolist() for k, v in inputs.items()}, "params": {"logits": True}}
    answer = requests.post(f"{base_url}/invocations", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    rows = answer.json()["predictions"]
    return [r["label"] for r in rows], np.asarray([r["logits"] for r in rows], dtype=np.float32)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stored_study(storage: str, study: str) -> Any:
    """``study`` as a driver stores it, or ``None`` before the driver made it. A SQLite file
    that does not exist yet is not opened: Optuna would create it, racing the driver's own
    creation of the schema (``UNIQUE constraint failed: alembic_version``)."""
    import optuna

    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).exists():
        return None
    try:
        return optuna.load_study(study_name=study, storage=storage)
    except KeyError:  # the file is there, the study not yet
        return None


def wait_for_a_running_trial(storage: str, driver: subprocess.Popen[str], study: str = "t") -> None:
    """Waits (180 s at most) until a trial of ``study`` is RUNNING with an epoch reported."""
    from optuna.trial import TrialState

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.3)
        stored = stored_study(storage, study)
        if stored is None:
            continue
        trials = stored.trials
        if any(t.state == TrialState.RUNNING and t.intermediate_values for t in trials):
            return
    pytest.fail("no trial ever ran")


def cli(
    *args: str, cwd: Path = REPO, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m search ARGS`` run to its end, output captured as text (``env``: the
    process's whole environment; by default this one's, with the repository importable)."""
    return subprocess.run(
        [sys.executable, "-m", "search", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO)} if env is None else env,
    )


def checked(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    """``cmd`` run to its end (120 s at most); fails the test when it exits non-zero."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kwargs)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{cmd[:3]} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


# ------------------------------------------------------------------------ a study's file


def sqlite_rows(db: Path, sql: str, *args: int) -> list[tuple]:
    """The rows of ``sql`` on the study's file; none before the file or its tables exist."""
    if not db.exists():
        return []
    try:
        with sqlite3.connect(db, timeout=30) as conn:
            return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:  # the first driver is creating the tables
        return []


def lease_of(db: Path) -> dict:
    """The study's lease as the driver last wrote it ({} before there is one)."""
    try:
        with sqlite3.connect(db, timeout=30) as conn:
            row = conn.execute(
                "SELECT value_json FROM study_user_attributes WHERE key = 'driver'"
            ).fetchone()
    except sqlite3.OperationalError:  # the driver is creating the tables
        return {}
    return json.loads(row[0]) if row else {}


# ----------------------------------------------------------------------------- PostgreSQL

PG_BINS = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
"""The ``initdb`` of each PostgreSQL server installed (Debian's layout), newest last."""
PG_USER = "search"


@dataclass(frozen=True)
class Postgres:
    """A running PostgreSQL server on 127.0.0.1 (fixture ``postgres``) with user
    :data:`PG_USER`, its password and a database ``optuna``."""

    port: int
    password: str

    def url(self, password: str) -> str:
        return f"postgresql://{PG_USER}:{password}@127.0.0.1:{self.port}/optuna"


# ------------------------------------------------------------ studies built in their storage


def make_study(
    tmp_path: Path, values: dict[float, TrialState], param: str = "x", **changes: Any
) -> Any:
    """A study whose trials have the given ``param`` values and states (value = param)."""
    spec = parse_spec(base_spec(tmp_path, **changes))
    study = open_study(spec)
    record_spec(study, spec)
    bounds = spec.space[param]
    for x, state in values.items():
        done = state == TrialState.COMPLETE
        study.add_trial(
            create_trial(
                state=state,
                value=x if done else None,
                params={param: x},
                distributions={param: FloatDistribution(*_range(bounds), log=param == "lr")},
                intermediate_values={1: x / 2} if state != TrialState.FAIL else {},
                user_attrs={"epochs": 1},
            )
        )
    return spec, study


def _range(param: Any) -> tuple[float, float]:
    dumped = param.model_dump(exclude_none=True) if hasattr(param, "model_dump") else dict(param)
    low, high = next(v for v in dumped.values() if isinstance(v, list | tuple))
    return float(low), float(high)


TWO = [{"metric": "val_accuracy", "mode": "max"}, {"metric": "latency_ms", "mode": "min"}]
"""Two objectives: ``val_accuracy`` up, ``latency_ms`` down."""
LATENCIES = [1, 2, 4, 8, 16, 32]
PARETO_POINTS = [(0.9, 16), (0.8, 8), (0.6, 2), (0.5, 4), (0.85, 32)]
"""``(x, latency)`` of :func:`built_study`'s trials: its front is trials 0 (0.9, 16),
1 (0.8, 8) and 2 (0.6, 2); 3 and 4 are dominated."""


def mo_spec(tmp: Path, **changes: Any) -> Any:
    """12 trials of 2 epochs, no ASHA, ``x`` and ``latency`` searched, two objectives."""
    spec = {
        "study": "mo",
        "objective": TWO,
        "budget": {"trials": 12, "max_epochs": 2},
        "asha": {"enabled": False},
        "sampler": {"name": "random", "seed": 1},
        "space": {"x": {"uniform": [0.2, 1.0]}, "latency": {"choice": LATENCIES}},
    }
    return parse_spec(base_spec(tmp, **(spec | changes)))


def built_study(tmp: Path, points: list[tuple[float, float]], **changes: Any) -> Any:
    """A multi-objective study with one COMPLETE trial per ``(x, latency)`` (values as the
    curve gives them after 2 epochs) and one PRUNED trial without values."""
    spec = mo_spec(tmp, **changes)
    study = open_study(spec)
    record_spec(study, spec)
    dists = {"x": FloatDistribution(0.2, 1.0), "latency": CategoricalDistribution(LATENCIES)}
    for x, latency in points:
        acc = 0.75 * x
        metrics = {"val_accuracy": acc, "val_loss": 1 - acc, "latency_ms": float(latency)}
        study.add_trial(
            create_trial(
                state=TrialState.COMPLETE,
                values=[acc, float(latency)][: len(spec.objectives)],
                params={"x": x, "latency": latency},
                distributions=dists,
                intermediate_values={1: x / 2, 2: acc},
                user_attrs={"epochs": 2, "seconds": 0.1, "device": "cpu", "metrics": metrics},
            )
        )
    study.add_trial(
        create_trial(
            state=TrialState.PRUNED,
            params={"x": 0.99, "latency": 1},
            distributions=dists,
            user_attrs={"epochs": 1},
        )
    )
    return spec, study


# ------------------------------------------------------------- a user's tabular ONNX model


def tabular_val() -> tuple[np.ndarray, np.ndarray]:
    """Validation arrays of the breast-cancer table: 30 standardised features, 2 classes."""
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    return x[::4], y[::4].astype(np.int64)


def tabular_mlp() -> Any:
    """A small PyTorch MLP for :func:`tabular_val`'s features (seeded, in eval mode)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 2)).eval()


def onnx_export(model: Any, path: Path) -> None:
    """``model`` (30 features in, input ``x``, output ``logits``) written to ``path`` as ONNX
    with a dynamic batch dimension."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.zeros(2, 30),),
            str(path),
            input_names=["x"],
            output_names=["logits"],
            dynamic_shapes=({0: torch.export.Dim("batch", min=1)},),
            dynamo=True,
            verbose=False,
            external_data=False,
        )


def tabular_bundle(
    tmp_path: Path, onnx_file: tuple[Path, float], *, declare: bool = True, target: Any = None
) -> Path:
    """A user's bundle: model.onnx, inputs.json (validation.npz), metrics.json, config.yaml
    naming a trainable that is importable nowhere."""
    import torch

    source, accuracy = onnx_file
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "model.onnx").write_bytes(source.read_bytes())
    x, y = tabular_val()
    if declare:
        write_inputs(
            bundle, {"x": x[:2]}, {"logits": [None, 2]}, validation=(torch.from_numpy(x), y)
        )
    final = {"val_accuracy": accuracy if target is None else target, "val_loss": 0.3}
    (bundle / "metrics.json").write_text(json.dumps({"final": final}))
    (bundle / "config.yaml").write_text(
        "study: tabular-final\ntrainable: nowhere_pkg.tabular:train\n"
        "objective: {metric: val_accuracy, mode: max}\n"
    )
    return bundle
