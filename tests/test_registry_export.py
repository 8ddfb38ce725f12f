"""``python -m search export --mlflow`` end to end against a real ``mlflow server``
(tests/conftest.py): every point of ``--pareto`` registered, through a tracking URI whose
password is kept out of everything written (one export proves both). A Keras winner
registered and served by ``mlflow models serve`` is tested on the Keras example's own export
(tests/test_examples.py).

The studies are built in their storage with the user attributes the runner writes (as in
tests/test_pareto_export.py); ``export`` itself runs for real: confirmation runs on the
session's Ray, the final model, the bundle, the registry.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from search.record.study import open_study, record_spec
from search.specs.schema import parse_spec
from tests.helpers import PARETO_POINTS as POINTS
from tests.helpers import base_spec, built_study, free_port
from tests.helpers import cli as _cli

pytest.importorskip("mlflow")

# CLI runs join the session's Ray (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.usefixtures("joins_session_ray")]

SECRET = "s3cret-pw"


def _versions(uri: str, name: str) -> list[Any]:
    import mlflow

    found = mlflow.MlflowClient(uri).search_model_versions(f"name='{name}'")
    return sorted(found, key=lambda v: int(v.version))


# front of two points: trials 0 (0.9, 16) and 1 (0.8, 8), one trading latency for accuracy
FRONT = POINTS[:2]


@pytest.fixture(scope="module")
def front(
    mlflow_server: str, session_ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One ``export --pareto --mlflow`` of a two-point front, its tracking URI holding a
    password (the server has no auth: it ignores it); its folder and the finished process."""
    tmp = tmp_path_factory.mktemp("front")
    spec, _ = built_study(tmp, FRONT, fixed={"onnx": True})
    port = mlflow_server.rsplit(":", 1)[1]
    uri = f"http://user:{SECRET}@127.0.0.1:{port}"
    out = tmp / "front"
    with pytest.MonkeyPatch.context() as patch:  # joins the session's Ray (joins_session_ray)
        patch.setenv("RAY_ADDRESS", session_ray_address)
        proc = _cli(
            "export", "mo", "--storage", spec.storage, "--pareto", "--seeds", "1",
            "--out", str(out), "--results", str(tmp / "r"), "--mlflow", uri,
            "--model-name", "mo-front", timeout=600,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_pareto_registers_one_version_per_point_tagged_with_its_trial(
    mlflow_server: str, front: tuple[Path, subprocess.CompletedProcess[str]]
) -> None:
    import mlflow

    out, _ = front
    versions = _versions(mlflow_server, "mo-front")
    assert len(versions) == len(FRONT) == 2
    by_trial = {int(v.tags["search.source_trial"]): v for v in versions}
    assert sorted(by_trial) == [0, 1]
    assert all(v.tags["search.study"] == "mo" for v in versions)
    assert len({v.version for v in versions}) == 2  # a version of its own per point
    for trial, version in by_trial.items():
        noted = json.loads((out / f"trial-{trial}" / "metrics.json").read_text())
        assert noted["registered_model"]["uri"] == f"models:/mo-front/{version.version}"
        assert noted["pareto"]["confirmed"]["latency_ms"]["mean"] == POINTS[trial][1]
    client = mlflow.MlflowClient(mlflow_server)
    # the alias names one version: the front's best on the primary objective (trial 0)
    assert client.get_model_version_by_alias("mo-front", "challenger").version == (
        by_trial[0].version
    )


def _written(folder: Path) -> str:
    """Every file under ``folder``, as text (bytes that are no UTF-8 replaced)."""
    return "".join(
        p.read_bytes().decode("utf-8", "replace") for p in sorted(folder.rglob("*")) if p.is_file()
    )


def test_a_tracking_uri_password_is_written_nowhere(
    mlflow_server: str,
    mlflow_root: Path,
    front: tuple[Path, subprocess.CompletedProcess[str]],
    tmp_path: Path,
) -> None:
    """The export of :func:`front` (a URI with a password) masks it in what it prints and
    writes it in no bundle, run, version or file of the server; a registry that refuses the
    connection is one line, masked, exit 2."""
    import mlflow

    out, proc = front
    assert "user:***@127.0.0.1" in proc.stdout  # the registry is named, masked
    assert SECRET not in proc.stdout + proc.stderr
    assert SECRET not in _written(out)
    client = mlflow.MlflowClient(mlflow_server)
    versions = _versions(mlflow_server, "mo-front")
    assert len(versions) == 2
    for version in versions:
        run = client.get_run(version.run_id)
        shown = [run.data.tags, run.data.params, version.tags, version.source, version.description]
        assert SECRET not in json.dumps(shown, default=str)
    assert SECRET not in _written(mlflow_root)  # the server's database and every artifact

    spec = parse_spec(base_spec(tmp_path, study="pw", fixed={"onnx": True}))
    study = open_study(spec)
    record_spec(study, spec)
    study.add_trial(_curve_trial(0.8))
    closed = f"http://user:{SECRET}@127.0.0.1:{free_port()}"  # nothing listens: refused
    proc = _cli("export", "pw", "--storage", spec.storage, "--mlflow", closed, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: --mlflow http://user:***@127.0.0.1:")
    assert SECRET not in proc.stdout + proc.stderr


def _curve_trial(x: float) -> Any:
    metrics = {"val_accuracy": 0.75 * x}
    return create_trial(
        state=TrialState.COMPLETE,
        value=0.75 * x,
        params={"x": x},
        distributions={"x": FloatDistribution(0.0, 1.0)},
        intermediate_values={1: x / 2, 2: 0.75 * x},
        user_attrs={"epochs": 2, "seconds": 0.1, "device": "cpu", "metrics": metrics},
    )
