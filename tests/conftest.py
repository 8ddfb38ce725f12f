"""Shared fixtures: one local Ray per test session, deterministic seeds, spec helpers, a real
MLflow server and its scoring server."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

try:  # torchvision must be imported before TensorFlow: the other order segfaults (triton)
    import torch  # noqa: F401
    import torchvision  # noqa: F401
except ImportError:  # a run without the torch extra still collects the framework's tests
    pass

REPO = Path(__file__).resolve().parents[1]


SLOWEST_FIRST = (
    # file: its time alone here, in a serial run of the whole suite (seconds, 2026-12-03)
    "test_examples.py",  # 158
    "test_tf_trainables.py",  # 108
    "test_registry_export.py",  # 98
    "test_outage.py",  # 95
    "test_chaos.py",  # 75
    "test_multiobjective.py",  # 61
    "test_run_e2e.py",  # 60
    "test_takeover.py",  # 60
    "test_lineage_onnx.py",  # 60 (measured alone on a loaded machine, 2026-12-04)
    "test_cluster.py",  # 54
    "test_placement.py",  # 52
    "test_resume.py",  # 50
    "test_tracking.py",  # 50
    "test_mistakes.py",  # 50
    "test_tf_reuse.py",  # 40 (measured alone, 2026-12-03)
    "test_sigterm.py",  # 39
    "test_ddp.py",  # 39
    "test_export.py",  # 39
    "test_chaos_process.py",  # 39
    "test_cli.py",  # 35
    "test_lightning_ddp.py",  # 30
    "test_torch_trainables.py",  # 28
    "test_warm_start.py",  # 27
    "test_pareto_export.py",  # 25
    "test_data_once.py",  # 24
    "test_lease.py",  # 22
    "test_budget.py",  # 22
    "test_piped_output.py",  # 22 (measured alone, 2026-12-03)
    "test_quality.py",  # 21
    "test_docs.py",  # 20 (measured alone)
    "test_local_ray.py",  # 21
)
"""The files that take longest, longest first: ``make test`` hands whole files to two
pytest-xdist workers in this order (``--dist loadfile``, so a module's fixtures run once), and
a long file that starts last would leave one worker alone at the end."""


NEEDS_RAY = frozenset({"ray_local", "session_ray_address", "joins_session_ray"})
"""Fixtures that start the session's Ray: a test using one is marked ``ray``, whatever its file
says, so ``make test-fast`` (``-m "not ray ..."``) never starts a Ray."""


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by the marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks ``ray`` every test that uses a fixture of :data:`NEEDS_RAY`; then, in a
    pytest-xdist worker, the files of :data:`SLOWEST_FIRST` first, in its order (every worker
    collects, and sorts, alike); the rest after them, as collected."""
    for item in items:
        if NEEDS_RAY & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ray)
    if not hasattr(config, "workerinput"):
        return
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(autouse=True)
def _seeded() -> None:
    random.seed(0)
    np.random.seed(0)


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """A real local Ray with 2 CPUs, started once for the whole session."""
    import ray

    from search.run.runner import init_ray

    init_ray(None, num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def session_ray_address(ray_local: None) -> str:
    """The address of the session's Ray, for drivers in other processes to join."""
    import ray

    return str(ray.get_runtime_context().gcs_address)


@pytest.fixture
def joins_session_ray(session_ray_address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m search`` started by the test joins the session's Ray (``RAY_ADDRESS``, read
    by ``--address``) instead of starting a Ray of its own: about 4 s and 6 CPU-s less per
    command on 2 cores. Tests of a run's own Ray (logical GPUs, kills during Ray's start) do
    not use it."""
    monkeypatch.setenv("RAY_ADDRESS", session_ray_address)


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


def venv_path() -> str:
    """``PATH`` with this interpreter's folder first, as in an activated venv (MLflow's
    scoring server is the venv's ``uvicorn``)."""
    return f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture(scope="session")
def mlflow_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of :func:`mlflow_server`'s database and artifacts."""
    return tmp_path_factory.mktemp("mlflow")


@pytest.fixture(scope="session")
def mlflow_server(mlflow_root: Path) -> Iterator[str]:
    """A real MLflow tracking server and registry (SQLite backend store, local artifacts) on
    127.0.0.1 and a free port, shared by the session: each test registers its own model name."""
    root = mlflow_root
    port = free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--backend-store-uri", f"sqlite:///{root}/mlflow.db", "--workers", "1"]
    cmd += ["--artifacts-destination", str(root / "artifacts")]
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


@contextlib.contextmanager
def served(model_uri: str, tracking_uri: str, log_dir: Path) -> Iterator[str]:
    """``mlflow models serve -m MODEL_URI --env-manager local`` on 127.0.0.1 and a free port,
    as the README shows it; yields its base URL once ``/ping`` answers."""
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "PATH": venv_path()}
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri]
    cmd += ["--env-manager", "local", "-p", str(port), "-h", "127.0.0.1"]
    log = (log_dir / "serve.log").open("wb")
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/ping", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def invocations(base_url: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The first output a scoring server's ``/invocations`` answers for ``inputs``."""
    import requests

    answer = requests.post(
        f"{base_url}/invocations",
        json={"inputs": {k: v.tolist() for k, v in inputs.items()}},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    got: Any = answer.json()["predictions"]
    got = next(iter(got.values())) if isinstance(got, dict) else got
    return np.asarray(got, dtype=np.float32)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for_a_running_trial(storage: str, driver: subprocess.Popen[str], study: str = "t") -> None:
    """Waits (180 s at most) until a trial of ``study`` is RUNNING with an epoch reported."""
    import optuna
    from optuna.trial import TrialState

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.3)
        try:
            trials = optuna.load_study(study_name=study, storage=storage).trials
        except KeyError:
            continue
        if any(t.state == TrialState.RUNNING and t.intermediate_values for t in trials):
            return
    pytest.fail("no trial ever ran")
