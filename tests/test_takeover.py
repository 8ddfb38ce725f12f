"""A live driver paused past its lease's expiry (SIGSTOP: a suspended VM, a stopped job, a long
pause) while a second driver starts on the same study: the second takes the study over and
says so, the first finds its lease taken when it resumes, stops asking for trials, says so and
exits with :data:`search.record.lease.TAKEN_EXIT_STATUS`. The budget holds, no config runs
twice, nothing is left RUNNING."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest

from search.record.lease import TAKEN_EXIT_STATUS
from search.record.resume import counts
from tests.helpers import base_spec, start_run, wait_for_a_running_trial, write_spec
from tests.helpers import lease_of as _lease_of

pytestmark = [pytest.mark.slow]

BUDGET = 8
TTL_S = 3.0  # the lease's expiry in both drivers (renewed every TTL_S / 6)
WAIT_S = 180.0


def _wait_until_taken(db: Path, first: str, second: subprocess.Popen[str]) -> str:
    """Waits until a run other than ``first`` holds the lease; returns its id."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and second.poll() is None:
        holder = _lease_of(db).get("run")
        if holder and holder != first:
            return str(holder)
        time.sleep(0.1)
    out = second.communicate(timeout=60)[0] if second.poll() is not None else ""
    pytest.fail(f"the second driver never took the study: {out[-3000:]}")


@pytest.mark.usefixtures("joins_session_ray")
def test_a_driver_paused_past_its_lease_loses_the_study_and_the_budget_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SEARCH_LEASE_TTL_S", str(TTL_S))
    data = base_spec(
        tmp_path,
        budget={"trials": BUDGET, "max_epochs": 3},
        fixed={"sleep": 0.4},
        asha={"enabled": False},
        sampler={"name": "random", "seed": 5},
    )
    spec = write_spec(tmp_path / "s.yaml", data)
    db = tmp_path / "optuna.db"
    first = start_run(spec)
    second: subprocess.Popen[str] | None = None
    try:
        wait_for_a_running_trial(data["storage"], first)
        paused = _lease_of(db)["run"]
        os.kill(first.pid, signal.SIGSTOP)
        time.sleep(TTL_S + 1.0)  # past the expiry, as the lease's own clock tells it too
        second = start_run(spec)
        _wait_until_taken(db, paused, second)
        os.kill(first.pid, signal.SIGCONT)
        out_first, _ = first.communicate(timeout=WAIT_S)
        out_second, _ = second.communicate(timeout=WAIT_S)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    trials = optuna.load_study(study_name="t", storage=data["storage"]).trials
    states = Counter(t.state.name for t in trials)
    counted = sum(counts(t) for t in trials)
    params = [tuple(sorted(t.params.items())) for t in trials if t.params]
    with capsys.disabled():
        print(
            f"\npaused driver: exit {first.returncode}, second {second.returncode}; "
            f"{len(trials)} trials {dict(states)}; counted {counted} of {BUDGET}"
        )
    took = [line for line in out_second.splitlines() if "taking study 't' over" in line]
    lost = [line for line in out_first.splitlines() if "was taken over by run" in line]
    assert first.returncode == TAKEN_EXIT_STATUS, out_first[-3000:]
    assert len(lost) == 1, out_first[-3000:]
    assert "Traceback" not in out_first, out_first[-3000:]
    assert second.returncode == 0, out_second[-3000:]
    assert len(took) == 1 and paused in took[0], out_second[-3000:]
    assert states["RUNNING"] == 0 and states["WAITING"] == 0, dict(states)
    assert counted == BUDGET, dict(states)
    assert len(params) == len(set(params))  # no config twice
