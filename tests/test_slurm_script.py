"""``search slurm``'s batch script and its refusals, without SLURM: ``--dry-run`` prints the
script, each bad option is one line naming it (exit 2), and nothing is written or submitted.
The jobs themselves run on a real SLURM in ``tests/test_slurm.py``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from search.cli import app
from tests.helpers import base_spec, write_spec


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder to submit from, holding ``s.yaml`` (storage in its ``results/``)."""
    write_spec(tmp_path / "s.yaml", base_spec(tmp_path, storage="sqlite:///results/optuna.db"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _slurm(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["slurm", "s.yaml", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_dry_run_prints_every_option_as_sbatch_names_it_and_writes_nothing(work: Path) -> None:
    code, text = _slurm(
        "--nodes", "2", "--gpus-per-node", "4", "--cpus-per-node", "32", "--time", "1-12",
        "--partition", "gpu", "--account", "lab", "--requeue", "--grace", "300",
        "--sbatch", "--mem=256G", "--sbatch", "--constraint=h100", "--trials", "64",
        "--study", "night", "--dry-run",
    )  # fmt: skip
    assert code == 0, text
    results = work / "results"
    for line in (
        "#SBATCH --job-name=search-night", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=32", "#SBATCH --gpus-per-node=4", "#SBATCH --time=1-12",
        "#SBATCH --partition=gpu", "#SBATCH --account=lab", "#SBATCH --requeue",
        f"#SBATCH --output={results}/slurm/%x-%j.out", "#SBATCH --signal=B:USR1@300",
        "#SBATCH --mem=256G", "#SBATCH --constraint=h100", f"cd {work} ",
        "REQUEUE=1",
    ):  # fmt: skip
        assert line in text, line
    run_line = next(line for line in text.splitlines() if line.startswith("STUDY_RUN=("))
    assert "-m search run s.yaml --results" in run_line and "--trials 64 --study night" in run_line
    assert "--dry-run" not in text  # the command it records is the one that submits
    assert not results.exists()  # a dry run writes nothing
    syntax = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert syntax.returncode == 0, syntax.stderr


def test_defaults_ask_slurm_for_nothing_more_and_do_not_requeue(work: Path) -> None:
    code, text = _slurm("--dry-run")
    assert code == 0, text
    sbatch = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert [line.split("=")[0] for line in sbatch] == [
        "#SBATCH --job-name", "#SBATCH --nodes", "#SBATCH --ntasks-per-node", "#SBATCH --output",
        "#SBATCH --open-mode", "#SBATCH --signal", "#SBATCH --no-requeue",
    ]  # fmt: skip
    assert "#SBATCH --signal=B:USR1@120" in sbatch and "REQUEUE=0" in text


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["--time", "1:2:3:4"], "error: --time: expected minutes, MM:SS, HH:MM:SS"),
        (["--time", "1", "--grace", "60"], "error: --grace: 60 s is not less than --time 1 (60 s)"),
        (["--grace", "0"], "error: --grace: expected seconds from 1 to 65535, got 0"),
        (["--nodes", "0"], "error: --nodes: expected 1 or more, got 0"),
        (["--sbatch", "mem=64G"], "error: --sbatch: expected an sbatch option such as --mem=64G"),
        (
            ["--storage", "sqlite:////dev/shm/x.db"],
            "error: --storage: /dev/shm/x.db is under /dev/shm",
        ),
        (["--results", "/dev/shm/r"], "error: --results: /dev/shm/r is under /dev/shm"),
        (
            ["--storage", "postgresql://bob:hunter2@db/optuna"],
            "error: --storage: the URL holds a password, which the batch script would keep",
        ),
        (["--trials", "0"], "error: s.yaml (with command-line options): budget.trials: Input"),
    ],
)
def test_a_bad_option_is_one_line_naming_it_and_nothing_is_written(
    work: Path, args: list[str], start: str
) -> None:
    code, out = _slurm(*args)
    assert code == 2, out
    assert out.startswith(start) and len(out.strip().splitlines()) == 1, out
    assert "hunter2" not in out
    assert not (work / "results").exists()


def test_a_password_from_the_environment_stays_a_reference_in_the_script(work: Path) -> None:
    url = "postgresql://bob:${PGPASSWORD}@db/optuna"
    code, text = _slurm("--storage", url, "--dry-run")
    assert code == 0, text
    assert (
        "--storage 'postgresql://bob:${PGPASSWORD}@db/optuna'" in text
    )  # quoted: search expands it


def test_without_sbatch_on_path_it_says_where_to_run(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    code, out = _slurm()
    assert code == 2
    assert out.startswith("error: sbatch not found on PATH: run `search slurm` on the cluster's")
    assert not (work / "results").exists()


def test_a_password_in_the_spec_stays_in_the_spec_and_is_never_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script names the spec, not its URL: a spec's literal password is not refused (the
    run redacts it as ever), and neither the script nor the lines printed hold it."""
    url = "postgresql://bob:hunter2@db/optuna"
    write_spec(tmp_path / "s.yaml", base_spec(tmp_path, storage=url))
    monkeypatch.chdir(tmp_path)
    code, text = _slurm("--dry-run")
    assert code == 0, text
    assert "hunter2" not in text
