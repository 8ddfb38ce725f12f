"""``export --mlflow``: the promotion rule and the refusals before any confirmation run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from search.handover.promote import verdict
from search.handover.registry import RegistryError, Target, preflight, scrub
from search.handover.registry_check import check_registered
from tests.helpers import REPO


def tags(mean: float, std: float = 0.01, runs: int = 3, data: str = "d1") -> dict[str, str]:
    return {
        "search.metric": "val_accuracy",
        "search.mode": "max",
        "search.confirmed_mean": repr(mean),
        "search.confirmed_std": repr(std),
        "search.confirmed_runs": str(runs),
        "search.data_fingerprint": data,
    }


def test_champion_moves_only_past_one_standard_error_on_the_same_data() -> None:
    assert verdict(tags(0.95), tags(0.90)) == ""  # 0.05 > sqrt(2 * 0.01**2 / 3)
    assert "does not beat" in verdict(tags(0.905), tags(0.90))
    assert "other validation data" in verdict(tags(0.99), tags(0.90, data="d2"))


def test_a_bad_alias_is_refused_in_one_line() -> None:
    with pytest.raises(RegistryError, match=r"--mlflow: alias 'v1'"):
        preflight(Target(uri="sqlite:///unused.db", model_name="m", alias="v1"))


def test_an_unreachable_registry_is_refused_with_its_password_masked() -> None:
    target = Target(uri="http://bob:s3cret@127.0.0.1:9", model_name="m")
    with pytest.raises(RegistryError) as err:
        preflight(target)
    assert "s3cret" not in str(err.value) and "cannot use the MLflow registry" in str(err.value)
    assert "s3cret" not in scrub("failed http://bob:s3cret@127.0.0.1:9/api", target.uri)


def test_checking_a_missing_sqlite_registry_is_one_line_and_creates_nothing(
    tmp_path: Path,
) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(RegistryError, match=r"^--mlflow sqlite:///.*mlflow.db: no such file"):
        check_registered("models:/m@champion", Target(uri=uri, model_name="-"))
    assert not (tmp_path / "mlflow.db").exists()


def test_check_reads_the_registry_from_mlflow_tracking_uri(tmp_path: Path) -> None:
    """``check models:/...`` with only ``MLFLOW_TRACKING_URI`` set uses that registry, as
    MLflow's own tools do (it once answered "give the registry with --mlflow URI")."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    done = subprocess.run(
        [sys.executable, "-m", "search", "check", "models:/m@champion"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "MLFLOW_TRACKING_URI": uri},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"--mlflow {uri}: no such file" in done.stderr, done.stderr
