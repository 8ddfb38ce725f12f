"""Shared fixtures: one local Ray per test session, deterministic seeds, a real MLflow server,
a real PostgreSQL server, a tabular model in ONNX. Plain helpers are in ``tests/helpers.py``."""

from __future__ import annotations

import linecache
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import (
    MLFLOW_SERVER_ENV,
    PG_BINS,
    PG_USER,
    Postgres,
    checked,
    free_port,
    onnx_export,
    stop,
    tabular_mlp,
    tabular_val,
    wait_http,
)

try:  # torchvision must be imported before TensorFlow: the other order segfaults (triton)
    import torch  # noqa: F401
    import torchvision  # noqa: F401
except ImportError:  # a run without the torch extra still collects the framework's tests
    pass


def _checkcache(filename: str | None = None) -> None:
    """``linecache.checkcache`` as the standard library's, but an entry removed while it
    runs is skipped. SQLAlchemy removes the entries of its generated code from a weakref
    finalizer, which the garbage collector may run in the middle of the stdlib's loop; every
    doctest's set-up (pdb's ``reset``) runs that loop, and CI once failed a doctest there
    with ``KeyError: '<sqlalchemy generated __init__ for class ...>'``. Set for every test
    process (this file loads before any test of ``tests/`` or ``search/`` runs)."""
    cache = linecache.cache
    names = list(cache) if filename is None else [filename] if filename in cache else []
    for name in names:
        entry = cache.get(name)
        if entry is None or len(entry) == 1 or entry[1] is None:
            continue  # gone meanwhile, lazy, or not from a file
        size, mtime, _, fullname = entry
        try:
            stat = os.stat(fullname)
        except OSError:
            cache.pop(name, None)
            continue
        if size != stat.st_size or mtime != stat.st_mtime:
            cache.pop(name, None)


linecache.checkcache = _checkcache


SLOWEST_FIRST = (
    # file: its time here, summed over its tests, in a two-worker `make test` of this checkout
    # (seconds, 2026-12-07, pytest --durations=300; test_slurm.py mostly waits on its jobs)
    "test_examples.py",  # 143
    "test_slurm.py",  # 125: mostly waits, so it starts beside the examples' CPU
    "test_gpu_check.py",  # 128
    "test_fused_run.py",  # 69
    "test_chaos.py",  # 61
    "test_quality.py",  # 59
    "test_notebook.py",  # 56
    "test_mistakes.py",  # 55
    "test_run_e2e.py",  # 52
    "test_sigterm.py",  # 49
    "test_outage.py",  # 46
    "test_resume.py",  # 44
    "test_tf_trainables.py",  # 44
    "test_cluster.py",  # 43
    "test_tracking.py",  # 37
    "test_fuse_auto.py",  # 34
    "test_chaos_process.py",  # 34
    "test_placement.py",  # 34
    "test_multiobjective.py",  # 33
    "test_lease.py",  # 30
    "test_lightning_ddp.py",  # 29
    "test_export.py",  # 28
    "test_docs.py",  # 27
    "test_cli.py",  # 26
    "test_ddp.py",  # 25
    "test_stall.py",  # 21
    "test_takeover.py",  # 21
    "test_disk_full.py",  # 20
    "test_optuna_suites.py",  # 20 alone: hundreds of short cases, none among the 300 longest
    "test_python_api.py",  # 20
    "test_resnet.py",  # 20
    "test_data_once.py",  # 18
    "test_lineage_onnx.py",  # 18
    "test_local_ray.py",  # 18
    "test_limits.py",  # 18
    "test_warm_start.py",  # 17
    "test_served_model.py",  # 17
    "test_registry_export.py",  # 16
    "test_tf_reuse.py",  # 14
    "test_image_folder.py",  # 14
    "test_torch_trainables.py",  # 13
    "test_pareto_export.py",  # 12
    "test_live_readers.py",  # 12 (2026-12-06)
    "test_budget.py",  # 12
    "test_report.py",  # 10
    "test_spaces.py",  # 10 (2026-12-06)
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

    from search.tuning.runner import init_ray

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
    env = {**os.environ, **MLFLOW_SERVER_ENV}
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A throwaway PostgreSQL server on 127.0.0.1 only, with a password user ``search``, shared
    by the session's files (each makes its own studies or databases); skips where PostgreSQL's
    server binaries are missing."""
    if not PG_BINS:
        pytest.skip("PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin/initdb)")
    bin_dir = Path(PG_BINS[-1]).parent
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    root = Path(tempfile.mkdtemp(prefix="search-pg-"))
    data = root / "data"
    password = "Pg" + secrets.token_hex(12)
    (root / "pw").write_text(password + "\n")
    if os.geteuid() == 0:
        for path in (root, root / "pw"):
            shutil.chown(path, "postgres", "postgres")
    root.chmod(0o700)
    port = free_port()
    started = False
    try:
        checked(
            [*as_owner, str(bin_dir / "initdb"), "-D", str(data), "-U", PG_USER,
             f"--pwfile={root / 'pw'}", "--auth=scram-sha-256", "-E", "UTF8", "--no-sync"]
        )  # fmt: skip
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off"
        checked(
            [*as_owner, str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options,
             "-l", str(root / "server.log"), "-w", "-t", "60", "start"]
        )  # fmt: skip
        started = True
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=port, user=PG_USER, password=password, dbname="postgres",
            autocommit=True, connect_timeout=10,
        ) as conn:  # fmt: skip
            conn.execute("CREATE DATABASE optuna")
        yield Postgres(port, password)
    finally:
        if started or (data / "postmaster.pid").exists():
            subprocess.run(
                [*as_owner, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w",
                 "stop"], capture_output=True, timeout=60,
            )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def onnx_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """A tabular MLP (breast cancer: 30 features, 2 classes; input ``x``) in ONNX, and its
    PyTorch accuracy on the validation arrays of :func:`tests.helpers.tabular_val`."""
    import torch

    model = tabular_mlp()
    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    onnx_export(model, path)
    x, y = tabular_val()
    with torch.no_grad():
        accuracy = float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())
    return path, accuracy
