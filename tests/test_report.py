"""The study report (``python -m search report``) and the console progress of ``run``.

One real run of the synthetic ``curve`` trainable on the session's local Ray gives a study
with COMPLETE, PRUNED and FAIL trials (``lr > 1`` turns the loss NaN at epoch 2); its console
progress is captured on the way.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import re

import pytest
from rich.console import Console

from search.record.study import load_study
from search.report.figures import FIGURES, learning_curves, too_few_for_importances
from search.report.html import summarize, write_report
from search.specs.derive import asha_milestones
from search.specs.schema import parse_spec
from search.tuning.bridge import OptunaBridge
from search.tuning.progress import ProgressCallback
from search.tuning.runner import RunOptions, run_study
from tests.helpers import base_spec
from tests.helpers import cli as _cli

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("joins_session_ray")]

MAX_EPOCHS = 9


@pytest.fixture(scope="module")
def ran(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    tmp = tmp_path_factory.mktemp("report")
    spec = parse_spec(
        base_spec(
            tmp,
            study="fates",
            budget={"trials": 10, "max_epochs": MAX_EPOCHS},
            asha={"grace_period": 1, "reduction_factor": 3},
            sampler={"name": "random", "seed": 1},
            resources={"max_concurrent": 2},
            space={"x": {"uniform": [0.0, 1.0]}, "lr": {"choice": [0.1, 0.5, 2.0]}},
        )
    )
    err = io.StringIO()
    with contextlib.redirect_stderr(err):  # the progress console writes to sys.stderr
        run_study(spec, RunOptions(results_dir=tmp / "results"))
    study = load_study("fates", spec.storage)
    return spec, study, tmp, err.getvalue()


def test_the_study_has_every_fate(ran: tuple) -> None:
    _, study, _, _ = ran
    states = {t.state.name for t in study.trials}
    assert {"COMPLETE", "PRUNED", "FAIL"} <= states


def test_report_holds_every_figure_and_opens_offline(ran: tuple) -> None:
    _, study, tmp, _ = ran
    path = write_report(study, tmp / "results")
    assert path == tmp / "results" / "fates" / "report.html"
    page = path.read_text()
    single = [(name, title) for name, title in FIGURES if name != "pareto-front"]
    # ASHA's cuts depend on the order results arrive: this study ends with 3 to 6 COMPLETE
    # trials, and below 5 the importances are a note (drawn: the test after next).
    too_few = too_few_for_importances(study)
    for name, title in single:
        if name == "param-importances" and too_few:
            assert f"id='{name}-missing'>{too_few}<" in page
            continue
        assert f'id="{name}"' in page, f"no plotly div for {name}"
        assert title in page
    assert "Pareto front" not in page  # one objective: no front
    assert page.count('class="plotly-graph-div"') >= len(single)  # slices: a row of 4 each
    assert not re.search(r"<script[^>]+src=[\"']https?:", page)  # no CDN
    assert page.count("plotly.js v") >= 1 and len(page) > 1_000_000  # plotly.js embedded
    for cell in ("complete / pruned / failed", "compute spent", "ASHA saved"):
        assert cell in page
    for name, _ in single:
        if name == "metrics":  # every metric, from epochs.csv: in the page only, no PNG
            continue
        if name == "param-importances" and too_few:  # said in the page, no PNG
            assert not (tmp / "results" / "fates" / "figures" / f"{name}.png").exists()
            continue
        png = tmp / "results" / "fates" / "figures" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_the_pngs_are_drawn_here_when_their_process_fails(
    ran: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    from search.report import pngs

    _, study, tmp, _ = ran

    def broken(*args: object) -> None:
        raise RuntimeError("the forked drawing died")

    monkeypatch.setattr(pngs, "_child", broken)  # what the fork runs, not the fallback
    folder = tmp / "fallback"
    pngs.start_pngs(study, folder)()
    assert (folder / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_counts_and_what_asha_saved(ran: tuple) -> None:
    _, study, _, _ = ran
    summary = summarize(study)
    states = [t.state.name for t in study.trials]
    assert (summary.complete, summary.pruned, summary.failed) == (
        states.count("COMPLETE"),
        states.count("PRUNED"),
        states.count("FAIL"),
    )
    assert summary.epochs_spent == sum(len(t.intermediate_values) for t in study.trials)
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert summary.epochs_saved == sum(MAX_EPOCHS - len(t.intermediate_values) for t in pruned)
    assert 0 < summary.saved_share < 1 and summary.seconds_spent > 0


def test_learning_curves_set_pruned_and_failed_trials_apart(ran: tuple) -> None:
    _, study, _, _ = ran
    fig = learning_curves(study)
    state = {t.number: t.state.name for t in study.trials}
    curves = [tr for tr in fig.data if tr.name and tr.name.startswith("#")]
    for trace in curves:
        number, shown = trace.name[1:].split()
        expected = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed"}
        assert shown == expected[state[int(number)]]
        dash = {"complete": "solid", "pruned": "dot", "failed": "dash"}[shown]
        assert trace.line.dash == dash
    assert {"complete", "pruned", "failed"} <= {tr.name for tr in fig.data}  # the legend


def test_report_command_prints_the_path(ran: tuple) -> None:
    spec, _, tmp, _ = ran
    proc = _cli("report", "fates", "--storage", spec.storage, "--results", str(tmp / "cli"))
    assert proc.returncode == 0, proc.stderr
    assert f"report {tmp / 'cli' / 'fates' / 'report.html'}" in proc.stdout.replace("\n", "")
    missing = _cli("report", "nope", "--storage", spec.storage)
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: study 'nope' is not in")
    assert missing.stderr.count("\n") == 1


def test_progress_prints_a_line_per_trial_and_the_rungs(ran: tuple) -> None:
    _, study, _, err = ran
    lines = [line for line in err.splitlines() if re.match(r"\[\s*[\d.]+s\s+\d+/10\]", line)]
    assert len(lines) == len(study.trials)
    for t in study.trials:
        assert any(re.search(rf"trial\s+{t.number} {t.state.name}", line) for line in lines)
    rungs = [line for line in err.splitlines() if line.startswith("rungs ")]
    assert rungs == [rungs[0]] and "≥1:10" in rungs[0] and f"end({MAX_EPOCHS})" in rungs[0]
    assert "\x1b[" not in err  # not a terminal: no live block, no escape codes


def test_progress_live_block_on_a_terminal_and_pickling(ran: tuple) -> None:
    spec, study, _, _ = ran
    bridge = OptunaBridge(
        study, spec.space, spec.fixed, metric="val_accuracy", mode="max", max_epochs=MAX_EPOCHS
    )
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    callback = ProgressCallback(
        bridge,
        "val_accuracy",
        "max",
        10,
        console,
        milestones=asha_milestones(1, 3, MAX_EPOCHS),
        max_epochs=MAX_EPOCHS,
        time_limit_s=60,
    )
    callback.setup()
    assert callback._live is not None  # a terminal gets the live block
    clone = pickle.loads(pickle.dumps(callback))  # Ray pickles callbacks with the experiment
    assert clone._live is None and clone.rung_text() == "rungs ≥1:0 ≥3:0 end(9):0"
    text = callback.status().plain
    assert "0 running" in text and "0/10 finished" in text and "left" in text
    callback.on_experiment_end([])
    assert callback._live is None


def test_the_figures_of_a_study_without_a_completed_trial_log_nothing() -> None:
    import logging

    import optuna

    from search.report.figures import plotly_figures

    study = optuna.create_study(direction="maximize")
    for _ in range(3):
        trial = study.ask()
        trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    heard: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: heard.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("optuna").addHandler(handler)
    try:
        figures = plotly_figures(study)
    finally:
        logging.getLogger("optuna").removeHandler(handler)
    assert set(figures) >= {"optimization-history", "slice", "parallel-coordinate"}
    assert heard == []  # optuna logs one warning a figure here (five lines after such a run)
    assert logging.getLogger("optuna").level != logging.ERROR  # and its level is given back


def test_importances_are_drawn_from_five_complete_trials_and_said_why_not_before() -> None:
    import optuna

    from search.report.figures import IMPORTANCE_MIN_TRIALS, plotly_figures

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(0))
    study.optimize(lambda t: t.suggest_float("x", 0, 1) + t.suggest_float("y", 0, 0.1), 4)
    said = plotly_figures(study)["param-importances"]
    assert said == "not drawn: 4 complete trials are too few for parameter importances (5 at least)"
    study.optimize(lambda t: t.suggest_float("x", 0, 1) + t.suggest_float("y", 0, 0.1), 1)
    assert IMPORTANCE_MIN_TRIALS == 5
    drawn = plotly_figures(study)["param-importances"]
    assert not isinstance(drawn, str) and {b.name for b in drawn.data} >= {"Objective Value"}
