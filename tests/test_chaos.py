"""Chaos: the driver is killed with ``kill -9`` at random moments, 20 times, then resumed.

Real processes (``python -m search run``), real Ray, a SQLite study. Most kills fall wherever
a delay drawn from a seeded generator lands: in the start-up and the resume itself, in ``ask``,
mid-epoch (``report``), at a trial's end (``tell``). Every fourth kill waits until the driver
has a trial of its own running, then falls a random moment later, so that kills land mid-trial
however slowly a loaded machine starts the driver. Every fourth driver runs in a PID
namespace of its own (``unshare --pid --fork --mount-proc``), so it is PID 1, as in a
container that is restarted. After the last, undisturbed run: no trial is RUNNING or WAITING,
the trials that count equal the budget, and no two trials share parameters.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest

from search.record.resume import INTERRUPTED
from tests.conftest import REPO, base_spec, write_spec

pytestmark = [pytest.mark.slow]

KILLS = 20
BUDGET = 10
NAMESPACED = ("unshare", "--pid", "--fork", "--mount-proc")


def _driver(spec: Path, namespaced: bool) -> subprocess.Popen:
    prefix = NAMESPACED if namespaced else ()
    return subprocess.Popen(
        [
            *prefix,
            sys.executable,
            "-m",
            "search",
            "run",
            str(spec),
            "--results",
            str(spec.parent / "res"),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "SEARCH_LEASE_TTL_S": "3"},
    )


def _query(db: Path, sql: str, *args: int) -> list[tuple]:
    """The rows of ``sql`` on the study's file; none before the file or its tables exist."""
    if not db.exists():
        return []
    try:
        with sqlite3.connect(db, timeout=30) as conn:
            return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:  # the first driver is creating the tables
        return []


def _last_trial_id(db: Path) -> int:
    """The study's newest trial id, -1 before there is one."""
    rows = _query(db, "SELECT max(trial_id) FROM trials")
    return -1 if not rows or rows[0][0] is None else int(rows[0][0])


def _a_new_trial_runs(db: Path, after: int) -> bool:
    sql = "SELECT 1 FROM trials WHERE trial_id > ? AND state = 'RUNNING'"
    return bool(_query(db, sql, after))


def _kill_mid_trial(proc: subprocess.Popen, db: Path, after: int, rng: random.Random) -> float:
    """Waits (at most 60 s) for the driver's first own trial to run, then waits a random
    0-1.2 s (under one epoch) more; returns the seconds from the driver's start."""
    start = time.monotonic()
    while proc.poll() is None and time.monotonic() - start < 60:
        if _a_new_trial_runs(db, after):
            time.sleep(rng.uniform(0.0, 1.2))
            break
        time.sleep(0.1)
    return time.monotonic() - start


def test_twenty_kill_9s_then_a_resume_leave_a_true_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namespaces = bool(shutil.which("unshare")) and os.geteuid() == 0
    data = base_spec(
        tmp_path,
        study="chaos",
        budget={"trials": BUDGET, "max_epochs": 3},
        # 10 trials x 3 epochs x 0.6 s, 2 at once: 9 s of trials, so no driver finishes the
        # whole budget before its kill (at most 10 s in, Ray's start included)
        fixed={"sleep": 0.6},
        asha={"enabled": False},
        sampler={"name": "random", "seed": 7},
    )
    spec = write_spec(tmp_path / "chaos.yaml", data)
    rng = random.Random(20261201)
    delays = []
    db = tmp_path / "optuna.db"
    for kill in range(KILLS):
        after = _last_trial_id(db)
        proc = _driver(spec, namespaced=namespaces and kill % 4 == 3)
        if kill % 4 == 1:
            delay = _kill_mid_trial(proc, db, after, rng)
        else:
            delay = rng.uniform(1.5, 10.0)  # the first trial starts 5-9 s in
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=delay)  # a driver that finished the budget early is fine
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        delays.append(delay)
    final = _driver(spec, namespaced=False)
    _, err = final.communicate(timeout=600)
    assert final.returncode == 0, err[-3000:]

    trials = optuna.load_study(study_name="chaos", storage=data["storage"]).trials
    states = Counter(t.state.name for t in trials)
    interrupted = sum(t.user_attrs.get("fail_reason") == INTERRUPTED for t in trials)
    counted = sum(t.state.is_finished() for t in trials) - interrupted
    params = [tuple(sorted(t.params.items())) for t in trials if t.params]
    duplicates = len(params) - len(set(params))
    with capsys.disabled():
        print(
            f"\nchaos: {KILLS} kill -9s (delays {min(delays):.1f}-{max(delays):.1f} s, every "
            f"4th in a PID namespace: {namespaces}); {len(trials)} trials: "
            f"{dict(states)}; interrupted {interrupted}; counted {counted} of budget "
            f"{BUDGET}; RUNNING {states['RUNNING'] + states['WAITING']}; "
            f"duplicate params {duplicates}"
        )
    assert states["RUNNING"] == 0 and states["WAITING"] == 0
    assert counted == BUDGET
    assert duplicates == 0
    assert interrupted > 0  # the kills did land mid-trial
