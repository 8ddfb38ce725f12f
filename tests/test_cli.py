"""The command line as a user meets it: real subprocesses, one-line errors, a live dashboard."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest

from tests.helpers import REPO, base_spec, write_spec
from tests.helpers import cli as _cli

# CLI runs join the session's Ray (tests/conftest.py)
pytestmark = [pytest.mark.usefixtures("joins_session_ray")]


def test_help_is_fast_and_imports_no_framework() -> None:
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from search.cli import app\n"
        "r = CliRunner().invoke(app, ['run', '--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "heavy = {'torch', 'tensorflow', 'ray', 'optuna', 'mlflow'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


RUN_IMPORTS = """
import atexit, sys
HEAVY = {"mlflow", "sklearn", "optuna_dashboard", "torch", "tensorflow"}
atexit.register(lambda: print("heavy:", sorted(HEAVY & set(sys.modules)), file=sys.stderr))
from search.cli import main
sys.argv = ["search", "run", *sys.argv[1:]]
main()
"""


def test_a_run_imports_no_library_it_does_not_use(tmp_path: Path) -> None:
    """Neither MLflow (Ray's usage tag of the callbacks imports it: 0.8 s), nor the dashboard's
    web app and scikit-learn (1.2 s, for the study's note), nor a framework the trainable
    does not use: every run's start and end pay for what they import."""
    spec = write_spec(
        tmp_path / "s.yaml", base_spec(tmp_path, budget={"trials": 2, "max_epochs": 2})
    )
    proc = subprocess.run(
        [sys.executable, "-c", RUN_IMPORTS, str(spec), "--results", str(tmp_path / "r")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == "heavy: []"
    assert (tmp_path / "r" / "t" / "report.html").is_file()  # and the run wrote its report


BAD_SPECS = {
    "unknown key": ({"bogus": 1}, "bogus: unknown key"),
    "low above high": ({"space": {"x": {"uniform": [1, 0]}}}, "space.x: uniform: low (1.0) must"),
    "unknown trainable": ({"trainable": "resnet9000"}, "trainable: unknown trainable 'resnet9000'"),
    "unknown distribution": ({"space": {"x": {"normal": [0, 1]}}}, "space.x.normal: unknown key"),
    "when names a missing parameter": (
        {"space": {"x": {"uniform": [0, 1], "when": {"opt": "sgd"}}}},
        "space.x.when: names 'opt'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_spec_exits_nonzero_with_one_line(tmp_path: Path, case: str) -> None:
    change, expected = BAD_SPECS[case]
    path = write_spec(tmp_path / "bad.yaml", base_spec(tmp_path, **change))
    proc = _cli("run", str(path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {path}: ")
    assert expected in lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "optuna.db").exists()  # nothing was started or written


def test_yaml_syntax_error_and_bad_override(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("study: [unclosed\n")
    proc = _cli("run", str(broken))
    assert proc.returncode == 2 and "YAML syntax error at line" in proc.stderr
    good = write_spec(tmp_path / "good.yaml", base_spec(tmp_path))
    proc = _cli("run", str(good), "--trials", "0")
    assert proc.returncode == 2
    assert "budget.trials: Input should be greater than or equal to 1, got 0" in proc.stderr


def test_trials_command_lists_the_study_and_names_missing_ones(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/o.db"
    study = optuna.create_study(study_name="listed", storage=storage)
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=0.25))
    proc = _cli("trials", "listed", "--storage", storage)
    assert proc.returncode == 0 and "COMPLETE" in proc.stdout and "0.25" in proc.stdout
    proc = _cli("trials", "absent", "--storage", storage)
    assert proc.returncode == 2
    assert "study 'absent' is not in" in proc.stderr and "listed" in proc.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_dashboard_serves_the_study_on_loopback(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/o.db"
    optuna.create_study(study_name="shown", storage=storage)
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "search", "dashboard", "--storage", storage, "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        body = None
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2) as r:
                    body = json.loads(r.read())
                break
            except OSError:
                time.sleep(0.2)
        assert body is not None, "dashboard did not answer"
        assert [s["study_name"] for s in body["study_summaries"]] == ["shown"]
        with socket.socket() as sock:  # bound to loopback only: the machine's own address fails
            other = socket.gethostbyname(socket.gethostname())
            if not other.startswith("127."):
                assert sock.connect_ex((other, port)) != 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_dashboard_on_other_host_warns_and_busy_port_fails(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _cli(
            "dashboard",
            "--storage",
            f"sqlite:///{tmp_path}/o.db",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
        )
        assert proc.returncode == 2 and "already in use" in proc.stderr
        proc = _cli(
            "dashboard",
            "--storage",
            f"sqlite:///{tmp_path}/o.db",
            "--port",
            str(port),
            "--host",
            "0.0.0.0",
        )
        assert "no authentication" in proc.stderr


@pytest.mark.slow
def test_a_run_where_no_trial_completes_exits_1_with_the_reason(tmp_path: Path) -> None:
    spec = base_spec(
        tmp_path,
        study="nan",
        budget={"trials": 2, "max_epochs": 3},
        fixed={"lr": 2.0},
        asha={"enabled": False},
    )  # lr > 1: NaN at epoch 2
    proc = _cli(
        "run", str(write_spec(tmp_path / "nan.yaml", spec)), "--results", str(tmp_path / "results")
    )
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        "error: no trial of this run completed (2 of 2 failed; first failure: "
        "val_loss is nan at epoch 2); see `python -m search trials nan`"
    )
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.slow
def test_code_that_fails_every_trial_alike_stops_the_run_early_in_one_line(
    tmp_path: Path,
) -> None:
    spec = base_spec(
        tmp_path,
        study="key",
        trainable="search.testing:hostile",
        budget={"trials": 12, "max_epochs": 2},
        fixed={"mode": "keyerror"},
        faults={"max_failures": 2},
    )
    proc = _cli(
        "run", str(write_spec(tmp_path / "key.yaml", spec)), "--results", str(tmp_path / "results")
    )
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: the first 3 trials failed the same way: KeyError: "
        "'learning_rate' (not retried: it fails the same way every time) "
        "(traceback: "
    )
    assert last.endswith(
        "traceback.txt); fix it and run again (the run stopped early, before its budget)"
    )
    path = last.split("(traceback: ")[1].split(")")[0]
    assert "KeyError: 'learning_rate'" in Path(path).read_text()
    trials = optuna.load_study(study_name="key", storage=spec["storage"]).trials
    assert len(trials) < 12 and all(t.state.name == "FAIL" for t in trials)
    assert all(t.user_attrs["retries"] == 0 for t in trials)
    assert "FAIL     epoch" in proc.stderr and "KeyError: 'learning_rate'" in proc.stderr
    noise = ("ExperimentalWarning", "Token authentication is enabled", "Traceback")
    assert not any(n in proc.stderr + proc.stdout for n in noise)


def test_a_misspelled_trainable_function_exits_2_at_once(tmp_path: Path) -> None:
    spec = base_spec(tmp_path, trainable="search.testing:cruve")
    proc = _cli("run", str(write_spec(tmp_path / "s.yaml", spec)))
    assert not (tmp_path / "optuna.db").exists()  # refused before the study, or Ray, started
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 's.yaml'}: trainable: trainable 'search.testing:cruve': module "
        "'search.testing' has no function 'cruve' (did you mean 'curve'?)"
    ]
    assert not (tmp_path / "optuna.db").exists()


def test_trials_leaves_a_parameter_a_trial_did_not_sample_blank() -> None:
    from rich.console import Console

    from search.report.console import print_trials

    study = optuna.create_study(study_name="conditional")
    sgd = {"optimizer": "sgd", "momentum": 0.9}
    adam = {"optimizer": "adam"}
    dists = {
        "optimizer": optuna.distributions.CategoricalDistribution(["sgd", "adam"]),
        "momentum": optuna.distributions.FloatDistribution(0.0, 0.99),
    }
    for params in (sgd, adam):
        used = {k: dists[k] for k in params}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=used, value=0.5))
    console = Console(record=True, width=200)
    print_trials(console, study)
    rows = [line for line in console.export_text().splitlines() if "COMPLETE" in line]
    assert len(rows) == 2 and "0.9" in rows[0]
    assert "adam" in rows[1] and "nan" not in rows[1].lower()


def test_the_exit_does_not_wait_forever_for_a_thread_pools_idle_workers() -> None:
    # MLflow's artifact download leaves such a pool: `check models:/...` hung after its OK
    code = (
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from search.cli import _exit_now\n"
        "pool = ThreadPoolExecutor(2)\n"  # held, as a module's pool is
        "pool.submit(print, 'done').result()\n"
        "_exit_now(3)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert (proc.returncode, proc.stdout) == (3, "done\n"), proc.stderr
