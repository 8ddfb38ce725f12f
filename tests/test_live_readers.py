"""A live study on SQLite stays readable, and writable, while another process reads it hard.

A separate process opens the storage the way ``optuna-dashboard sqlite:///...`` does (a plain
URL: no WAL pragma, SQLite's default 5 s busy timeout) and, for the whole run, loads the study,
reads every trial with its intermediate values and calls the dashboard's JSON API, in a tight
loop. The run must finish every trial and the reader must never see an error.

What WAL and the busy timeout buy, measured with this scenario on a 2-core machine (the run's
storage swapped for a variant by monkeypatching ``search.record.study.open_storage``):

- as shipped (WAL, 60 s timeout): 0 reader errors, run 14 s, ~800 reads;
- WAL, busy timeout 0: 0 reader errors, run 16 s;
- rollback journal, pysqlite's default 5 s timeout: 0 errors in 3 runs, but the run took
  22-26 s (writes queue behind the reader's locks); a reader holding a read longer than 5 s
  (a big study) would fail the run;
- rollback journal, busy timeout 0: the run crashed at once, ``StorageInternalError`` from
  ``sqlite3.OperationalError: database is locked``.

So this test would fail without both (last case); with a timeout alone it passes here, slower.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from search.record.study import load_study, open_study
from search.specs.schema import parse_spec
from search.tuning.runner import RunOptions, run_study
from tests.helpers import REPO, base_spec

pytestmark = [pytest.mark.ray]

TRIALS = 12

READER = textwrap.dedent(
    """
    import json, sys, time, traceback
    from wsgiref.util import setup_testing_defaults

    import optuna
    import optuna_dashboard

    url, name, stop, out = sys.argv[1:5]
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = optuna.storages.RDBStorage(url)  # as optuna-dashboard opens a plain URL
    app = optuna_dashboard.wsgi(storage)


    def get(path):
        env = {"PATH_INFO": path, "QUERY_STRING": ""}
        setup_testing_defaults(env)
        status = []
        body = b"".join(app(env, lambda s, h, exc_info=None: status.append(s)))
        if not status[0].startswith("200"):
            raise RuntimeError(f"{path}: HTTP {status[0]}: {body[:200]!r}")
        return json.loads(body)


    stats = {"reads": 0, "api_reads": 0, "reads_while_running": 0, "values_seen": 0,
             "errors": [], "error_count": 0}
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            study = optuna.load_study(study_name=name, storage=storage)
            trials = study.get_trials(deepcopy=False)
            stats["values_seen"] = max(
                stats["values_seen"], sum(len(t.intermediate_values) for t in trials)
            )
            stats["reads"] += 1
            if any(t.state.name == "RUNNING" for t in trials):
                stats["reads_while_running"] += 1
            if stats["reads"] % 5 == 0:
                studies = get("/api/studies")
                study_id = next(s["study_id"] for s in studies["study_summaries"]
                                if s["study_name"] == name)
                detail = get(f"/api/studies/{study_id}")
                # the dashboard caches a study's trials for a few seconds, so its count may lag
                # or lead the read above; but it shows this study, every trial once, numbered
                # without a gap
                shown = sorted(t["number"] for t in detail["trials"])
                if detail["name"] != name or shown != list(range(len(shown))):
                    raise RuntimeError(f"the API shows {detail['name']}'s trials {shown}")
                stats["api_reads"] += 1
        except Exception as exc:
            stats["error_count"] += 1
            if len(stats["errors"]) < 5:
                stats["errors"].append(traceback.format_exception_only(exc)[-1].strip())
        try:
            open(stop).close()
            break
        except FileNotFoundError:
            pass
    with open(out, "w") as fh:
        json.dump(stats, fh)
    """
)


def test_run_finishes_while_a_reader_hammers_the_storage(ray_local: None, tmp_path: Path) -> None:
    spec = parse_spec(
        base_spec(
            tmp_path,
            study="live",
            budget={"trials": TRIALS, "max_epochs": 4},
            asha={"grace_period": 1, "reduction_factor": 2},
            fixed={"sleep": 0.05},
        )
    )
    open_study(spec)  # the dashboard opens an existing study: create it before the reader
    stop, out = tmp_path / "stop", tmp_path / "reader.json"
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, spec.storage, spec.study, str(stop), str(out)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        time.sleep(2.0)  # the reader is importing and then reading before the run starts
        assert reader.poll() is None, "the reader died before the run started"
        summary = run_study(spec, RunOptions(results_dir=tmp_path / "results", progress=False))
    finally:
        stop.touch()
        reader.wait(timeout=60)
    stats = json.loads(out.read_text())

    study = load_study("live", spec.storage)
    states = Counter(t.state.name for t in study.trials)
    assert summary.trials_this_run == TRIALS
    assert len(study.trials) == TRIALS
    assert set(states) <= {"COMPLETE", "PRUNED"}, states  # none RUNNING, none failed
    assert sum(len(t.intermediate_values) for t in study.trials) >= TRIALS
    assert stats["error_count"] == 0, stats["errors"]
    assert stats["reads"] >= 50, stats
    assert stats["reads_while_running"] >= 10, stats  # it did read during the run
    assert stats["api_reads"] >= 10, stats
    assert stats["values_seen"] > 0, stats
