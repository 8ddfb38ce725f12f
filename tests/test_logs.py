"""Every trial's output: captured into ``output.log``, recorded, printed by ``search logs``."""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from search.cli import app
from search.record.artifacts import attached, store_path
from search.record.study import load_study
from search.report.logs import print_log
from search.specs.schema import parse_spec
from search.tuning.output import captured
from search.tuning.runner import RunOptions, run_study
from tests.helpers import base_spec

TRIALS = 3
FAILS = 1
"""The trial number that raises (a code error: it fails at once, after its prints)."""


@pytest.fixture(scope="module")
def ran(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    tmp = tmp_path_factory.mktemp("logs")
    spec = parse_spec(
        base_spec(
            tmp,
            study="chat",
            trainable="search.testing:chatty",
            budget={"trials": TRIALS, "max_epochs": 1},
            resources={"max_concurrent": 2},
            fixed={"fail_trial": FAILS},
        )
    )
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        run_study(spec, RunOptions(results_dir=tmp / "results"))
    return spec, load_study("chat", spec.storage), tmp, err.getvalue()


@pytest.mark.ray
def test_each_trial_output_log_holds_its_own_prints_and_the_trial_names_it(ran: tuple) -> None:
    _, study, tmp, _ = ran
    assert len(study.trials) == TRIALS
    for t in study.trials:
        path = Path(t.user_attrs["log"])
        assert path.name == "output.log" and path.parent.parent.parent == tmp / "results" / "ray"
        text = path.read_text()
        for where in ("stdout", "stderr", "child"):
            assert f"{where} of trial {t.number}\n" in text
        others = [n for n in range(TRIALS) if n != t.number]
        assert not any(f"of trial {n}\n" in text for n in others)
    failed = study.trials[FAILS]
    assert failed.state.name == "FAIL"
    assert Path(failed.user_attrs["traceback"]).parent == Path(failed.user_attrs["log"]).parent


@pytest.mark.ray
def test_each_finished_trial_has_its_output_as_a_dashboard_artifact(ran: tuple) -> None:
    _, study, tmp, _ = ran
    have = attached(study)
    for t in study.trials:  # the failed one too
        name = f"trial-{t.number:04d}-output.log"
        assert list(have[t._trial_id]) == [name]
        body = (store_path(tmp / "results", "chat") / have[t._trial_id][name]).read_text()
        assert body == Path(t.user_attrs["log"]).read_text()
        assert f"stdout of trial {t.number}\n" in body


@pytest.mark.ray
def test_the_fail_line_names_the_output_beside_the_traceback(ran: tuple) -> None:
    _, study, _, err = ran
    attrs = study.trials[FAILS].user_attrs
    joined = "".join(err.splitlines())  # the console folds long lines
    line = joined[joined.index(f"trial {FAILS:>3} FAIL") :]
    assert line.startswith(f"trial {FAILS:>3} FAIL")
    assert f"(traceback: {attrs['traceback']}; output: {attrs['log']})" in line
    assert joined.count("output: ") == 1  # only the FAIL line names it


@pytest.mark.ray
def test_logs_prints_the_trial_output_and_a_missing_trial_gets_one_line(ran: tuple) -> None:
    spec, _, _, _ = ran
    runner = CliRunner()
    shown = runner.invoke(app, ["logs", "chat", "2", "--storage", spec.storage])
    assert shown.exit_code == 0, shown.output
    assert "stdout of trial 2\n" in shown.output and "stderr of trial 2\n" in shown.output
    missing = runner.invoke(app, ["logs", "chat", "99", "--storage", spec.storage])
    assert missing.exit_code == 2
    lines = missing.output.strip().splitlines()
    assert lines == [
        "error: TRIAL: study 'chat' has no trial 99 (it has 3 trials, numbered from 0)"
    ]
    nostudy = runner.invoke(app, ["logs", "nope", "0", "--storage", spec.storage])
    assert nostudy.exit_code == 2 and len(nostudy.output.strip().splitlines()) == 1


def test_follow_prints_what_a_running_trial_writes_until_it_ends(tmp_path: Path) -> None:
    study = optuna.create_study(study_name="f", storage=f"sqlite:///{tmp_path}/f.db")
    trial = study.ask()
    log = tmp_path / "output.log"
    log.write_text("first\n")
    trial.set_user_attr("log", str(log))
    out = io.StringIO()
    follower = threading.Thread(
        target=print_log, args=(study, 0), kwargs={"follow": True, "out": out}
    )
    follower.start()
    time.sleep(0.3)
    with log.open("a") as f:
        f.write("second\n")
    time.sleep(0.7)
    assert follower.is_alive()  # still RUNNING: still following
    with log.open("a") as f:
        f.write("last\n")
    study.tell(trial, 1.0)
    follower.join(timeout=10)
    assert not follower.is_alive()
    assert out.getvalue() == "first\nsecond\nlast\n"


def test_capture_is_at_the_fd_level_and_restored_per_trial(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    for n in (1, 2):
        with captured(tmp_path / str(n)) as path:
            os.write(1, f"out {n}\n".encode())
            os.write(2, f"err {n}\n".encode())
        assert path is not None and path.read_text() == f"out {n}\nerr {n}\n"
    os.write(1, b"after\n")
    assert capfd.readouterr().out == "after\n"


def test_logs_rank_prints_one_process_of_a_data_parallel_trial(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/r.db"
    study = optuna.create_study(study_name="r", storage=url)
    trial = study.ask()
    (tmp_path / "output.log").write_text("rank 0 line\n")
    (tmp_path / "output.rank1.log").write_text("rank 1 line\n")
    (tmp_path / "output.rank10.log").write_text("rank 10 line\n")
    trial.set_user_attr("log", str(tmp_path / "output.log"))
    study.tell(trial, 1.0)
    runner = CliRunner()
    for rank, text in (("0", "rank 0 line\n"), ("1", "rank 1 line\n"), ("10", "rank 10 line\n")):
        shown = runner.invoke(app, ["logs", "r", "0", "--rank", rank, "--storage", url])
        assert (shown.exit_code, shown.output) == (0, text)
    missing = runner.invoke(app, ["logs", "r", "0", "--rank", "2", "--storage", url])
    assert missing.exit_code == 2
    assert missing.output.strip().splitlines() == [
        "error: --rank: trial 0 of study 'r' has no output of rank 2 (output.rank2.log is not "
        "beside output.log; ranks with output: 0, 1, 10)"
    ]
