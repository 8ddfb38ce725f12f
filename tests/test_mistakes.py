"""A user's ordinary mistakes are caught at the first line they can be (issue 23).

Each test runs ``python -m search`` on a user module written into ``tmp_path``, as a user
would, and asserts the one line, the exit status, how far the run got (Ray never started,
the trials it ran) and that no library warning reaches the console.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.helpers import REPO, base_spec, write_spec

USER_MODULE = """
from search import train_to_end, trainable


def returns(config, data, ctx):
    return {"val_accuracy": 0.5}


def reads_alpha(config, data, ctx):
    alpha = config.get("alpha", 0.1)
    for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
        yield {"val_accuracy": 1.0 - abs(alpha - 0.3) + 0.01 * epoch}


DEFAULTS = {"alpha": 0.1, "beta": 0.5, "gamma": 1.0}


def merges_defaults(config, data, ctx):
    cfg = {**DEFAULTS, **config}
    for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
        yield {"val_accuracy": 1.0 - abs(cfg["alpha"] - 0.3) + 0.01 * epoch}


def merges_and_reads_all(config, data, ctx):
    cfg = DEFAULTS | config
    for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
        yield {"val_accuracy": cfg["alpha"] * cfg["beta"] + 0.01 * epoch}


def misnamed(config, data, ctx):
    for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
        yield {"accuracy": config["alpha"] * epoch}


@trainable(defaults={"alpha": 0.1})
def no_model(config, data, ctx):
    for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
        yield {"val_accuracy": config["alpha"] * epoch / ctx.max_epochs}


@no_model.exporter
def export_no_model(config, data, ctx, out_dir):
    return train_to_end(no_model, config, data, ctx).metrics


@trainable(defaults={"alpha": 0.1})
def with_model(config, data, ctx):
    for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
        yield {"val_accuracy": config["alpha"] * epoch / ctx.max_epochs}
    return {"alpha": config["alpha"]}


@with_model.exporter
def export_with_model(config, data, ctx, out_dir):
    import json

    trained = train_to_end(with_model, config, data, ctx)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "model.json").write_text(json.dumps(trained.model))
    return trained.metrics
"""

WARNINGS = ("All-NaN", "No artists with labels", "Traceback", "Warning:")
"""What must not reach the console: NumPy's and matplotlib's warnings, and tracebacks."""


def _spec(tmp_path: Path, trainable: str, **changes: Any) -> Path:
    (tmp_path / "usermod.py").write_text(USER_MODULE)
    data: dict[str, Any] = {
        "study": trainable,
        "trainable": f"usermod:{trainable}",
        "objective": {"metric": "val_accuracy", "mode": "max"},
        "budget": {"trials": 6, "max_epochs": 2},
        "sampler": {"name": "random", "seed": 0},
        "storage": f"sqlite:///{tmp_path}/optuna.db",
        "resources": {"max_concurrent": 1},
        "space": {"alpha": {"uniform": [0.1, 1.0]}},
        **changes,
    }
    return write_spec(tmp_path / f"{trainable}.yaml", data)


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m search ARGS`` with the user's module importable, results in ``tmp_path``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    results = ["--results", str(tmp_path / "results")]
    return subprocess.run(
        [sys.executable, "-m", "search", *args, *results],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def _trials(tmp_path: Path, study: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study, storage=f"sqlite:///{tmp_path}/optuna.db").trials


def test_a_function_that_returns_is_refused_before_ray_starts(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "returns")
    proc = _cli(tmp_path, "run", str(spec))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"error: {spec}: trainable `usermod:returns` must yield one dict of metrics per epoch "
        "(a generator); it returns instead"
    ]
    assert not (tmp_path / "results").exists()  # no Ray experiment folder: Ray never started
    assert not (tmp_path / "optuna.db").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("joins_session_ray")
def test_a_space_key_a_plain_function_never_reads_stops_the_run_after_one_trial(
    tmp_path: Path,
) -> None:
    spec = _spec(tmp_path, "reads_alpha", space={"alpah": {"uniform": [0.1, 1.0]}})
    proc = _cli(tmp_path, "run", str(spec))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {spec}: space key 'alpah' is never read by trainable usermod:reads_alpha "
        "(did you mean 'alpha'?); fix it and run again (the run stopped early, before its "
        "budget)"
    )
    trials = _trials(tmp_path, "reads_alpha")
    assert trials[0].state.name == "COMPLETE"
    # one trial at a time (budget 6): the run stopped after the first, the next one at most cut
    assert len(trials) <= 2, [(t.number, t.state.name) for t in trials]
    assert not any(w in proc.stderr + proc.stdout for w in WARNINGS), proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.usefixtures("joins_session_ray")
def test_a_space_key_a_trainable_merging_its_defaults_never_reads_stops_the_run(
    tmp_path: Path,
) -> None:
    """``cfg = {**DEFAULTS, **config}`` reads the config in bulk: ``gamma``, a default the
    code never reads, is still named after the first trial (issue 35)."""
    space = {"alpha": {"uniform": [0.1, 1.0]}, "gamma": {"uniform": [0.1, 1.0]}}
    spec = _spec(tmp_path, "merges_defaults", space=space)
    proc = _cli(tmp_path, "run", str(spec))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {spec}: space key 'gamma' is never read by trainable usermod:merges_defaults "
        "(remove it, or give it a when: if only some configs read it); fix it and run again "
        "(the run stopped early, before its budget)"
    )
    assert len(_trials(tmp_path, "merges_defaults")) <= 2


@pytest.mark.slow
@pytest.mark.usefixtures("joins_session_ray")
def test_a_trainable_merging_its_defaults_that_reads_every_key_runs_its_budget(
    tmp_path: Path,
) -> None:
    space = {"alpha": {"uniform": [0.1, 1.0]}, "beta": {"uniform": [0.1, 1.0]}}
    spec = _spec(
        tmp_path, "merges_and_reads_all", space=space, budget={"trials": 3, "max_epochs": 1}
    )
    proc = _cli(tmp_path, "run", str(spec))
    assert proc.returncode == 0, proc.stderr[-3000:]
    states = [t.state.name for t in _trials(tmp_path, "merges_and_reads_all")]
    assert states == ["COMPLETE"] * 3


@pytest.mark.slow
@pytest.mark.usefixtures("joins_session_ray")
def test_a_run_whose_trials_fail_prints_no_numpy_warning(tmp_path: Path) -> None:
    spec = _spec(
        tmp_path,
        "misnamed",
        resources={"max_concurrent": 2},
        asha={"enabled": True, "grace_period": 1, "reduction_factor": 2},
    )
    proc = _cli(tmp_path, "run", str(spec))
    assert proc.returncode == 2, proc.stderr[-3000:]  # the first 3 trials failed alike
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the first 3 trials failed the same way: metric val_accuracy")
    assert all(t.state.name == "FAIL" for t in _trials(tmp_path, "misnamed"))
    assert not any(w in proc.stderr + proc.stdout for w in WARNINGS), proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.usefixtures("joins_session_ray")
def test_export_refuses_a_trainable_that_returns_no_model_before_confirming(
    tmp_path: Path,
) -> None:
    run = _cli(tmp_path, "run", str(_spec(tmp_path, "no_model", budget={"trials": 2})))
    assert run.returncode == 0, run.stderr[-3000:]
    storage = f"sqlite:///{tmp_path}/optuna.db"
    proc = _cli(tmp_path, "export", "no_model", "--storage", storage)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "error: trainable usermod:no_model returned no model: end it with `return model` so "
        "export can save it"
    ]
    assert "confirm" not in proc.stdout  # no confirmation run was started
    assert not (tmp_path / "results" / "no_model" / "export").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("joins_session_ray")
def test_an_export_prints_no_warning_and_keeps_its_confirmation_runs_apart(
    tmp_path: Path,
) -> None:
    run = _cli(tmp_path, "run", str(_spec(tmp_path, "with_model", budget={"trials": 2})))
    assert run.returncode == 0, run.stderr[-3000:]
    storage = f"sqlite:///{tmp_path}/optuna.db"
    proc = _cli(
        tmp_path, "export", "with_model", "--storage", storage, "--top-k", "1", "--seeds", "2"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "results" / "with_model" / "export" / "model.json").exists()
    assert not any(w in proc.stderr + proc.stdout for w in WARNINGS), proc.stderr[-3000:]
    # optuna-dashboard lists every study of its storage: the user's holds only theirs
    assert optuna.get_all_study_names(storage) == ["with_model"]
    confirm = tmp_path / "results" / "with_model" / "confirm.db"
    (name,) = optuna.get_all_study_names(f"sqlite:///{confirm}")
    assert len(optuna.load_study(study_name=name, storage=f"sqlite:///{confirm}").trials) == 2


SLOW_IMPORT = """
import sys
import time

if "search.cli" in sys.modules:  # the command's own import (its preflight), not a worker's
    time.sleep(IMPORT_S)


def same_error(config, data, ctx):
    time.sleep(1.0 + 5.0 * config["alpha"])  # the second trial is still running at the third FAIL
    raise ValueError("the same error every time")
    yield {}
"""


@pytest.mark.slow
@pytest.mark.usefixtures("joins_session_ray")
def test_a_run_stopped_by_alike_failures_prints_every_fail_and_the_commands_wall_time(
    tmp_path: Path,
) -> None:
    """Issue 35 item 6: the trial running when the run stopped early gets its FAIL line too,
    and the summary's wall time counts from the command's start (the trainable's slow import
    included, as a TensorFlow user's is), not from the runner's."""
    import re

    seconds = 5.0
    (tmp_path / "slowmod.py").write_text(SLOW_IMPORT.replace("IMPORT_S", str(seconds)))
    data = base_spec(
        tmp_path,
        study="alike",
        trainable="slowmod:same_error",
        budget={"trials": 8, "max_epochs": 2},
        resources={"max_concurrent": 2},
        faults={"max_failures": 0},
        space={"alpha": {"uniform": [0.1, 1.0]}},
    )
    proc = _cli(tmp_path, "run", str(write_spec(tmp_path / "alike.yaml", data)))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "the first 3 trials failed the same way: ValueError" in proc.stderr
    failed = [t.number for t in _trials(tmp_path, "alike") if t.state.name == "FAIL"]
    assert len(failed) >= 4, failed  # the run stopped while a trial was still running
    lines = re.findall(r"\[\s*([\d.]+)s\s+\d+/8\] trial\s+(\d+) FAIL", proc.stderr)
    assert sorted(int(n) for _, n in lines) == failed, proc.stderr[-3000:]
    wall = float(re.findall(r"wall time ([\d.]+) s", proc.stdout)[0])
    # the progress clock starts once Ray Tune does, after the import: the command took longer
    assert wall >= seconds + max(float(stamp) for stamp, _ in lines), proc.stdout
