"""Chaos of processes: trial workers killed, the database locked, the driver stopped, in one study.

Real processes (``python -m search run`` with a local Ray of its own), a SQLite study. While
the first driver runs: a trial worker (a Ray worker below the driver, running a trial) gets
``kill -9`` once a trial has reported an epoch; a second connection holds ``BEGIN EXCLUSIVE``
on the study's file for a few seconds; a second worker is killed; and once three trials
have finished the driver gets SIGTERM (exit 143). The same command then finishes the study.
At the end: nothing RUNNING or WAITING, the trials that count equal the budget, no two
trials share parameters, every COMPLETE or PRUNED trial has every epoch in the record, and
every FAIL says truly why: ``interrupted ...`` for those the SIGTERM cut, ``worker killed
without a word ...`` for those whose worker was killed.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from search.record.resume import INTERRUPTED
from search.tuning.death import SILENT
from search.tuning.signals import EXIT_STATUS
from tests.helpers import REPO, base_spec, start_run, write_spec
from tests.helpers import sqlite_rows as _query

pytestmark = [pytest.mark.slow]

BUDGET = 10
EPOCHS = 3
LOCK_S = 4.0  # over a lease renewal period (2.5 s): a renewal waits for it too
WAIT_S = 240.0  # generous: the machine may be loaded
TRIAL_TITLES = ("ray::ImplicitFunc", "ray::_Inner")
DIED = re.compile(re.escape(SILENT) + r" at epoch [1-3]")
DIED_UNSTARTED = re.compile(r"worker died \(Ray: [^)]+\) at epoch 1")
"""A worker killed before its trial opened ``output.log`` leaves no log to read: Ray's exit
detail is all the driver has (the kill can land on a worker that is just taking a trial)."""


def _driver(spec: Path) -> subprocess.Popen[str]:
    """``python -m search run`` with a local Ray of its own (not the session's)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return start_run(spec, env={**env, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL)


def _wait_for(proc: subprocess.Popen[str], what: str, done: Callable[[], bool]) -> None:
    """Polls ``done`` until it holds; fails the test if the driver exits or time runs out."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if done():
            return
        if proc.poll() is not None:
            err = proc.stderr.read()[-3000:] if proc.stderr else ""
            pytest.fail(f"the driver exited ({proc.returncode}) before {what}: {err}")
        time.sleep(0.2)
    pytest.fail(f"no {what} within {WAIT_S:.0f} s")


def _reported(db: Path, after: int) -> bool:
    """Whether a RUNNING trial with a number above ``after`` has reported an epoch."""
    sql = (
        "SELECT 1 FROM trials t JOIN trial_intermediate_values v ON v.trial_id = t.trial_id "
        "WHERE t.state = 'RUNNING' AND t.number > ?"
    )
    return bool(_query(db, sql, after))


def _finished(db: Path) -> int:
    rows = _query(db, "SELECT count(*) FROM trials WHERE state IN ('COMPLETE','PRUNED','FAIL')")
    return int(rows[0][0]) if rows else 0


def _trial_workers(driver: int) -> list[psutil.Process]:
    """The Ray workers below ``driver`` that run a trial (by their process title)."""
    found = []
    for child in psutil.Process(driver).children(recursive=True):
        try:
            line = " ".join(child.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if line.startswith(TRIAL_TITLES):
            found.append(child)
    return found


def _kill_a_trial_worker(proc: subprocess.Popen[str], db: Path, after: int) -> None:
    """``kill -9`` of one trial worker of ``proc``, once a trial numbered above ``after``
    has reported an epoch."""
    _wait_for(proc, "a trial reporting an epoch", lambda: _reported(db, after))
    workers: list[psutil.Process] = []
    _wait_for(
        proc, "a trial worker", lambda: workers.extend(_trial_workers(proc.pid)) or bool(workers)
    )
    workers[0].send_signal(signal.SIGKILL)


def _hold_exclusive(db: Path, seconds: float) -> threading.Thread:
    """Holds ``BEGIN EXCLUSIVE`` on ``db`` for ``seconds`` from a connection of its own."""
    held = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(db, timeout=60, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            held.set()
            time.sleep(seconds)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(timeout=90), "the lock was never taken"
    return thread


def _true_reason(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a FAIL trial says truly why: cut by the SIGTERM, or its worker killed."""
    reason = str(trial.user_attrs.get("fail_reason", ""))
    if reason == INTERRUPTED:
        return True
    # A SIGKILL leaves nothing in the trial's log (no process sees it coming), and the log
    # saying nothing is what search/tuning/death.py reports: "worker killed without a word ...".
    return bool(DIED.fullmatch(reason) or DIED_UNSTARTED.fullmatch(reason))


def test_killed_workers_a_locked_database_and_a_sigterm_leave_a_true_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = base_spec(
        tmp_path,
        study="chaos",
        budget={"trials": BUDGET, "max_epochs": EPOCHS},
        fixed={"sleep": 0.6},  # 10 trials x 3 epochs x 0.6 s, 2 at once: 9 s of trials
        asha={"enabled": False},
        sampler={"name": "random", "seed": 11},
        faults={"max_failures": 0},  # a killed worker's trial fails, with its reason
    )
    spec = write_spec(tmp_path / "chaos.yaml", data)
    db = tmp_path / "optuna.db"
    first = _driver(spec)
    _kill_a_trial_worker(first, db, after=-1)
    lock = _hold_exclusive(db, LOCK_S)
    lock.join(timeout=90)
    _kill_a_trial_worker(first, db, after=1)
    _wait_for(first, "3 finished trials and one reporting", lambda: _finished(db) >= 3 and (
        _reported(db, -1)
    ))  # fmt: skip
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=WAIT_S)
    assert first.returncode == EXIT_STATUS, err[-3000:]
    final = _driver(spec)
    _, err = final.communicate(timeout=600)
    assert final.returncode == 0, err[-3000:]

    trials = optuna.load_study(study_name="chaos", storage=data["storage"]).trials
    states = Counter(t.state.name for t in trials)
    failed = [t for t in trials if t.state == TrialState.FAIL]
    interrupted = [t for t in failed if t.user_attrs.get("fail_reason") == INTERRUPTED]
    died = [t for t in failed if t not in interrupted]
    counted = sum(t.state.is_finished() for t in trials) - len(interrupted)
    params = [tuple(sorted(t.params.items())) for t in trials if t.params]
    duplicates = len(params) - len(set(params))
    ended = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    gaps = [
        t.number
        for t in ended
        if sorted(t.intermediate_values) != list(range(1, int(t.user_attrs["epochs"]) + 1))
    ]
    with capsys.disabled():
        print(
            f"\nchaos of processes: {len(trials)} trials {dict(states)}; interrupted "
            f"{len(interrupted)}; worker deaths {[t.user_attrs['fail_reason'] for t in died]}; "
            f"counted {counted} of {BUDGET}; duplicates {duplicates}; epoch gaps {gaps}"
        )
    assert states["RUNNING"] == 0 and states["WAITING"] == 0
    assert counted == BUDGET
    assert duplicates == 0
    assert gaps == []
    complete = [t for t in ended if t.state == TrialState.COMPLETE]
    assert all(int(t.user_attrs["epochs"]) == EPOCHS for t in complete)
    assert interrupted, "the SIGTERM cut no trial"
    assert died, "no trial failed of its killed worker"
    assert all(_true_reason(t) for t in failed), [t.user_attrs.get("fail_reason") for t in failed]
