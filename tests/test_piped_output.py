"""Output that survives a pipe: run through the CLI with stdout and stderr captured (not a
terminal), no line and no table cell is wrapped, so a path or a number can be copied."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from search.record.study import open_study, record_spec
from search.specs.schema import parse_spec
from tests.helpers import base_spec, write_spec
from tests.helpers import cli as _cli

METRICS = {f"a_rather_long_metric_name_{i}": 4.557e-05 * (i + 1) for i in range(12)}


def test_trials_with_every_metric_prints_each_number_whole(tmp_path: Path) -> None:
    spec = parse_spec(base_spec(tmp_path))
    study = open_study(spec)
    record_spec(study, spec)
    for x in (0.25, 0.5):
        study.add_trial(
            create_trial(
                state=TrialState.COMPLETE,
                value=x,
                params={"x": x},
                distributions={"x": FloatDistribution(0.0, 1.0)},
                user_attrs={"epochs": 3, "metrics": METRICS},
            )
        )
    done = _cli("trials", "t", "--storage", spec.storage, "--metrics", "all")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith(("│", "┃"))]
    assert len(rows) == 3, done.stdout  # the header and two trials, one line each
    for name, value in METRICS.items():
        assert name in rows[0] and f"{value:.4g}" in rows[1] and f"{value:.4g}" in rows[2]


@pytest.mark.usefixtures("joins_session_ray")
def test_a_failed_trials_line_keeps_its_log_path_whole(tmp_path: Path) -> None:
    deep = tmp_path / ("a_folder_with_a_long_name_" * 3) / "results"
    data = base_spec(
        tmp_path,
        budget={"trials": 1, "max_epochs": 2},
        space={},
        fixed={"x": 0.5, "raise_at": 1},
        faults={"max_failures": 0},
    )
    spec = write_spec(tmp_path / "s.yaml", data)
    done = _cli("run", str(spec), "--results", str(deep))
    line = next(x for x in done.stderr.splitlines() if "FAIL" in x and "trial   0" in x)
    study = optuna.load_study(study_name="t", storage=parse_spec(data).storage)
    log = study.trials[0].user_attrs["log"]
    assert len(log) > 80 and f"output: {log})" in line, done.stderr
    # every path the run printed (the FAIL line's traceback and output, the summary's
    # folders) is whole on its line: each names a file or folder that is there
    printed = re.findall(r"(?:traceback|output): ([^;)\s]+)", done.stderr)
    printed += re.findall(r"(?:results in|report) (/\S+?)/?(?:\s|$)", done.stdout)
    assert len(printed) >= 3, done.stdout + done.stderr
    assert all(Path(path).exists() for path in printed), printed
