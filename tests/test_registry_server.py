"""``export --mlflow`` against a real ``mlflow server`` (SQLite backend store, local artifact
root, 127.0.0.1): a PyTorch bundle registered, promoted (and refused), loaded by alias with
``check models:/...``, and served by ``mlflow models serve``, whose HTTP answers equal
onnxruntime's on the bundle's ``model.onnx``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mlflow")
torch = pytest.importorskip("torch")

from search.handover.registry import Target, register_bundle  # noqa: E402
from search.handover.registry_check import check_registered  # noqa: E402
from tests import test_check  # noqa: E402
from tests.test_check import _bundle, _val  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.torch]
onnx_file = test_check.onnx_file  # the tabular MLP in ONNX, and its PyTorch accuracy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], seconds: float = 120) -> None:
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


def _stop(proc: subprocess.Popen[bytes]) -> None:
    import signal

    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real tracking server and registry on 127.0.0.1 and a free port."""
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--backend-store-uri", f"sqlite:///{root}/mlflow.db", "--workers", "1"]
    cmd += ["--artifacts-destination", str(root / "artifacts")]
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


def _exported(tmp_path: Path, onnx_file: tuple[Path, float], mean: float) -> Path:
    """A bundle as ``export`` leaves it: the tabular MLP of ``test_check`` with the
    confirmation's numbers in ``metrics.json``."""
    tmp_path.mkdir()
    bundle = _bundle(tmp_path, onnx_file)
    metrics = json.loads((bundle / "metrics.json").read_text())
    metrics.update(
        study="tabular",
        objective={"metric": "val_accuracy", "mode": "max"},
        chosen={"source_trial": 3, "seed": 7},
        seeds=[5, 6],
        confirmation=[
            {"source_trial": 3, "runs": 2, "failed": 0, "mean": mean, "std": 0.002}
            | {"min": mean - 0.002, "max": mean + 0.002}
        ],
        final_history=[{"val_accuracy": 0.8}, {"val_accuracy": onnx_file[1]}],
    )
    (bundle / "metrics.json").write_text(json.dumps(metrics))
    return bundle


def test_a_torch_winner_is_registered_promoted_checked_and_served(
    mlflow_server: str, onnx_file: tuple[Path, float], tmp_path: Path
) -> None:
    import mlflow
    import onnxruntime as ort
    import requests

    lines: list[str] = []
    target = Target(uri=mlflow_server, model_name="tabular-mlp", promote=True)
    first = register_bundle(_exported(tmp_path / "a", onnx_file, 0.95), target, lines.append)
    second = register_bundle(_exported(tmp_path / "b", onnx_file, 0.951), target, lines.append)
    assert (first, second) == ("models:/tabular-mlp/1", "models:/tabular-mlp/2")
    assert "champion is now version 1 of tabular-mlp (the first)" in lines
    assert any(line.startswith("champion stays at version 1") for line in lines), lines

    client = mlflow.MlflowClient(mlflow_server)
    assert client.get_model_version_by_alias("tabular-mlp", "champion").version == "1"
    assert client.get_model_version_by_alias("tabular-mlp", "challenger").version == "2"
    run = client.get_run(client.get_model_version("tabular-mlp", "1").run_id)
    assert run.data.tags["search.source_trial"] == "3"
    assert run.data.metrics["confirmed.val_accuracy.mean"] == pytest.approx(0.95)
    noted = json.loads((tmp_path / "a" / "bundle" / "metrics.json").read_text())
    assert noted["registered_model"]["uri"] == first

    checked = check_registered("models:/tabular-mlp@champion", Target(mlflow_server, "-"))
    assert checked[-1] == "OK: models:/tabular-mlp@champion reproduces the exported accuracy"

    x, _ = _val()
    expected = ort.InferenceSession(str(onnx_file[0])).run(None, {"x": x[:5]})[0]
    port = _free_port()
    # the scoring server is the venv's uvicorn, found on PATH as in an activated venv
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server, "PATH": path}
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m"]
    cmd += ["models:/tabular-mlp@champion", "--env-manager", "local", "-p", str(port)]
    cmd += ["-h", "127.0.0.1"]
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/ping", proc)
        answer = requests.post(
            f"http://127.0.0.1:{port}/invocations",
            json={"inputs": {"x": x[:5].tolist()}},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        got: Any = answer.json()["predictions"]
        got = got["logits"] if isinstance(got, dict) else got
        np.testing.assert_allclose(np.asarray(got, dtype=np.float32), expected, atol=1e-5)
    finally:
        _stop(proc)
