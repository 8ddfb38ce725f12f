"""Chaos: the driver is killed with ``kill -9`` at random moments, 10 times (``SEARCH_CHAOS_KILLS``
sets another count: 20 is the full drill), then resumed.

Real processes (``python -m search run``), real Ray, a SQLite study. Most kills fall wherever
a delay drawn from a seeded generator lands: in the start-up and the resume itself, in ``ask``,
mid-epoch (``report``), at a trial's end (``tell``). Every fourth kill waits until the driver
has a trial of its own running, then falls a random moment later, so that kills land mid-trial
however slowly a loaded machine starts the driver. Every fourth driver runs in a PID
namespace of its own (``unshare --pid --fork --mount-proc``), so it is PID 1, as in a
container that is restarted. The last, undisturbed run joins the session's Ray. After it: no
trial is RUNNING or WAITING, the trials that count equal the budget, and no two trials share
parameters.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest

from search.record.resume import INTERRUPTED
from tests.helpers import REPO, base_spec, start_run, write_spec
from tests.helpers import sqlite_rows as _query

pytestmark = [pytest.mark.slow]

KILLS = int(os.environ.get("SEARCH_CHAOS_KILLS", "10"))
"""10 in ``make test`` (92 s alone here): 3 of them mid-trial, 2 as PID 1."""
BUDGET = 10
NAMESPACED = ("unshare", "--pid", "--fork", "--mount-proc")


def _driver(spec: Path, namespaced: bool) -> subprocess.Popen[str]:
    """A driver with a local Ray of its own (never the session's: its kills must land in
    Ray's start too, and leave nothing in a Ray other tests use)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(REPO), SEARCH_LEASE_TTL_S="3")
    prefix = NAMESPACED if namespaced else ()
    return start_run(spec, prefix=prefix, env=env, stdout=subprocess.DEVNULL)


def _last_trial_id(db: Path) -> int:
    """The study's newest trial id, -1 before there is one."""
    rows = _query(db, "SELECT max(trial_id) FROM trials")
    return -1 if not rows or rows[0][0] is None else int(rows[0][0])


def _a_new_trial_runs(db: Path, after: int) -> bool:
    sql = "SELECT 1 FROM trials WHERE trial_id > ? AND state = 'RUNNING'"
    return bool(_query(db, sql, after))


def _kill_mid_trial(
    proc: subprocess.Popen[str], db: Path, after: int, rng: random.Random
) -> tuple[float, float]:
    """Waits (at most 60 s) for the driver's first own trial to run, then waits a random
    0-1.0 s (under one trial) more; returns the seconds from the driver's start to its first
    trial and to the kill."""
    start = time.monotonic()
    first = float("nan")
    while proc.poll() is None and time.monotonic() - start < 60:
        if _a_new_trial_runs(db, after):
            first = time.monotonic() - start
            time.sleep(rng.uniform(0.0, 1.0))
            break
        time.sleep(0.1)
    return first, time.monotonic() - start


def test_kill_9s_then_a_resume_leave_a_true_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], session_ray_address: str
) -> None:
    namespaces = bool(shutil.which("unshare")) and os.geteuid() == 0
    data = base_spec(
        tmp_path,
        study="chaos",
        budget={"trials": BUDGET, "max_epochs": 3},
        # 10 trials x 3 epochs x 0.5 s, 2 at once: 7.5 s of trials, so no driver finishes the
        # whole budget before its kill (at most 9 s in, Ray's start included)
        fixed={"sleep": 0.5},
        asha={"enabled": False},
        sampler={"name": "random", "seed": 7},
    )
    spec = write_spec(tmp_path / "chaos.yaml", data)
    rng = random.Random(20261201)
    delays, firsts = [], []
    db = tmp_path / "optuna.db"
    for kill in range(KILLS):
        after = _last_trial_id(db)
        proc = _driver(spec, namespaced=namespaces and kill % 4 == 3)
        if kill % 4 == 1:
            first, delay = _kill_mid_trial(proc, db, after, rng)
            firsts.append(first)
        else:
            # the first trial starts 4.8-8.2 s in on a 2-core machine (the kills mid-trial
            # print when): before it, kills land in Ray's start and the resume; after, in
            # ask, report and tell of the first trials (one lasts 1.5 s)
            delay = rng.uniform(1.0, 9.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=delay)  # a driver that finished the budget early is fine
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        delays.append(delay)
    # the undisturbed run joins the session's Ray (its start is not what is tested); it still
    # takes the study over from the last killed driver and stops what that one left
    joins = {**os.environ, "PYTHONPATH": str(REPO), "SEARCH_LEASE_TTL_S": "3"}
    final = start_run(
        spec, env={**joins, "RAY_ADDRESS": session_ray_address}, stdout=subprocess.DEVNULL
    )
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
            f"4th in a PID namespace: {namespaces}; first trials at "
            f"{', '.join(f'{f:.1f}' for f in firsts)} s); {len(trials)} trials: "
            f"{dict(states)}; interrupted {interrupted}; counted {counted} of budget "
            f"{BUDGET}; RUNNING {states['RUNNING'] + states['WAITING']}; "
            f"duplicate params {duplicates}"
        )
    assert states["RUNNING"] == 0 and states["WAITING"] == 0
    assert counted == BUDGET
    assert duplicates == 0
    assert interrupted > 0  # the kills did land mid-trial
