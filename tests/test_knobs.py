"""Knobs the trainable does not read, and missing files, fail before any trial starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from search.specs.knobs import KnobError, check_knobs, declared_knobs
from search.specs.schema import parse_spec
from tests.helpers import REPO, base_spec, write_spec
from tests.helpers import cli as _cli

# CLI runs join the session's Ray (tests/conftest.py)
pytestmark = [pytest.mark.usefixtures("joins_session_ray")]


def test_user_trainable_without_defaults_is_not_checked(tmp_path: Path) -> None:
    assert declared_knobs("search.testing:curve") is None
    check_knobs(parse_spec(base_spec(tmp_path, space={"anything": {"uniform": [0, 1]}})))


@pytest.mark.torch
def test_misspelled_knob_and_missing_weights_fail_in_one_line(tmp_path: Path) -> None:
    spec = parse_spec(
        base_spec(tmp_path, trainable="torch_cnn", space={"lrr": {"uniform": [0, 1]}})
    )
    with pytest.raises(
        KnobError, match=r"f.yaml: space.lrr: torch_cnn has no knob 'lrr' \(known: "
    ):
        check_knobs(spec, "f.yaml")
    missing = parse_spec(
        base_spec(
            tmp_path,
            trainable="torch_transfer",
            space={"lr": {"uniform": [0, 1]}},
            fixed={"weights_path": str(tmp_path / "absent.pt")},
        )
    )
    with pytest.raises(KnobError, match="fixed.weights_path: no file at"):
        check_knobs(missing)
    check_knobs(
        parse_spec(base_spec(tmp_path, trainable="torch_cnn", space={"lr": {"uniform": [0, 1]}}))
    )


@pytest.mark.torch
def test_cli_refuses_a_misspelled_knob_before_starting(tmp_path: Path) -> None:
    path = write_spec(
        tmp_path / "typo.yaml",
        base_spec(
            tmp_path,
            trainable="torch_cnn",
            fixed={"chanels": 8},
            space={"lr": {"uniform": [0.001, 0.1]}},
        ),
    )
    proc = _cli("run", str(path), cwd=REPO)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip().splitlines() == [proc.stderr.strip()]
        and "fixed.chanels: torch_cnn has no knob 'chanels'" in proc.stderr
    )
    assert not (tmp_path / "optuna.db").exists()


def _python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_checking_a_builtins_knobs_imports_no_framework(tmp_path: Path) -> None:
    spec_path = write_spec(
        tmp_path / "s.yaml", base_spec(tmp_path, space={"lr": {"uniform": [0.001, 0.1]}})
    )
    code = f"""
import sys
from search.specs.knobs import KnobError, check_knobs
from search.specs.schema import load_spec, with_overrides
from search.contract import BUILTIN
spec = load_spec({str(spec_path)!r})
for name in sorted(BUILTIN):
    check_knobs(with_overrides(spec, trainable=name))
    try:
        check_knobs(with_overrides(spec, trainable=name, fixed={{"chanels": 8}}))
    except KnobError:
        pass
    else:
        raise SystemExit(name + " took a misspelled knob")
print(sorted(m for m in ("torch", "tensorflow", "keras") if m in sys.modules))
"""
    assert _python(code) == "[]"


@pytest.mark.torch
@pytest.mark.tf
def test_each_builtins_knob_table_is_what_its_trainable_declares() -> None:
    code = """
import torch  # before TensorFlow (torchvision after TensorFlow segfaults here)
from search.contract import BUILTIN, declarations, declared_defaults
print(sorted(n for n in BUILTIN if declarations(n).defaults != declared_defaults(n)))
"""
    assert _python(code) == "[]"


def test_a_builtins_misspelled_knob_stops_the_run_before_ray_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from search.tuning import runner

    def no_ray(address: object = None) -> None:
        raise AssertionError("Ray was started")

    monkeypatch.setattr(runner, "init_ray", no_ray)
    spec = parse_spec(
        base_spec(tmp_path, trainable="torch_cnn", space={"lrr": {"uniform": [0.001, 0.1]}})
    )
    with pytest.raises(KnobError, match="space.lrr: torch_cnn has no knob 'lrr'"):
        runner.run_study(spec, runner.RunOptions(results_dir=tmp_path / "r", progress=False))
    assert not (tmp_path / "optuna.db").exists()


def test_run_refuses_a_builtins_misspelled_knob_before_importing_ray_tune(
    tmp_path: Path,
) -> None:
    spec_path = write_spec(
        tmp_path / "s.yaml",
        base_spec(tmp_path, trainable="torch_cnn", space={"lrr": {"uniform": [0.001, 0.1]}}),
    )
    code = f"""
import sys
from search.cli import app
status = app(["run", {str(spec_path)!r}], standalone_mode=False)
print(status, sorted(m for m in ("ray.tune", "torch", "mlflow") if m in sys.modules))
"""
    # exit status 2, and neither Ray Tune (over a second to import) nor torch imported
    assert _python(code) == "2 []"
    assert not (tmp_path / "optuna.db").exists()
