"""What a run leaves for a person once its trials are settled, for ``run`` and ``search.run``:
``trials.csv`` and ``best.yaml``, the summary, the report and the dashboard's notes.

Example:
    >>> from rich.console import Console
    >>> callable(after_run) and callable(Console)
    True
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from search.errors import one_line
from search.record.queries import write_results
from search.report.console import print_summary
from search.report.dashboard import publish_study
from search.report.html import report_study

if TYPE_CHECKING:
    import optuna
    from rich.console import Console

    from search.specs.schema import StudySpec
    from search.tuning.options import RunSummary


def after_run(
    console: Console, study: optuna.Study, spec: StudySpec, summary: RunSummary, results: Path
) -> Path:
    """Writes the results, prints the summary and writes the report; returns the study's
    results folder. A report that fails costs a warning line, not the run."""
    folder = write_results(study, spec, results)
    print_summary(console, study, summary, folder)
    try:
        path = report_study(study, results, pngs=False)  # `report` draws the PNGs
        publish_study(study, results)  # the dashboard's note and trial artifacts
    except Exception as exc:  # the run itself succeeded; the report is a convenience
        print(f"warning: report not written: {one_line(str(exc))}", file=sys.stderr)
        return folder
    console.print(f"report {path}")
    return folder


def no_trial_completed(study: optuna.Study, states: dict[int, str]) -> str:
    """The line for a run none of whose trials (``states``: number -> state) completed."""
    reasons = [
        t.user_attrs.get("fail_reason")
        for t in study.get_trials(deepcopy=False)
        if t.number in states and t.state.name == "FAIL"
    ]
    failed = sum(s == "FAIL" for s in states.values())
    why = f"; first failure: {one_line(str(reasons[0]))}" if reasons and reasons[0] else ""
    return (
        f"no trial of this run completed ({failed} of {len(states)} failed{why}); "
        f"see `python -m search trials {study.study_name}`"
    )
