"""SIGTERM to the driver (Kubernetes), or to its process group (Slurm), ends a run as Ctrl-C
does, and loses no budget."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from search.record.resume import INTERRUPTED
from search.run.signals import EXIT_STATUS
from tests.conftest import REPO, base_spec, start_run, wait_for_a_running_trial, write_spec


def _assert_replaced_next_run(spec: Path, storage: str, env: dict[str, str] | None = None) -> None:
    """Every trial settled, the cut ones FAIL ``interrupted``; the same command again runs the
    budget's trials, the cut ones replaced."""
    trials = optuna.load_study(study_name="t", storage=storage).trials
    assert not [t for t in trials if not t.state.is_finished()]
    cut = [t for t in trials if t.user_attrs.get("fail_reason") == INTERRUPTED]
    assert cut and all(t.state == TrialState.FAIL for t in cut)
    again = subprocess.run(
        [sys.executable, "-m", "search", "run", str(spec), "--results", str(spec.parent / "r")],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    after = optuna.load_study(study_name="t", storage=storage).trials
    done = [t for t in after if t.state == TrialState.COMPLETE]
    assert len(done) == 2 and len(after) == 2 + len(cut)  # the budget, the cut ones replaced


@pytest.mark.slow
@pytest.mark.usefixtures("joins_session_ray")  # the CLI runs join the session's Ray
def test_sigterm_ends_the_run_like_ctrl_c_and_the_next_run_replaces_its_cut_trials(
    tmp_path: Path,
) -> None:
    data = base_spec(
        tmp_path, budget={"trials": 2, "max_epochs": 3}, fixed={"sleep": 1.0},
        asha={"enabled": False},
    )  # fmt: skip
    spec = write_spec(tmp_path / "s.yaml", data)
    driver = start_run(spec)
    wait_for_a_running_trial(data["storage"], driver)
    os.kill(driver.pid, signal.SIGTERM)
    out, _ = driver.communicate(timeout=120)

    assert driver.returncode == EXIT_STATUS, out
    assert out.count("trials this run") == 1, out  # the summary, once
    assert "SIGTERM received" not in out  # Ray's stack dump of the signal
    _assert_replaced_next_run(spec, data["storage"])


@pytest.mark.slow
def test_sigterm_to_the_process_group_with_its_own_ray_ends_the_run_as_to_the_driver(
    tmp_path: Path, session_ray_address: str
) -> None:
    """Slurm's ``killpg``: the run's own Ray is out of the group, so Tune stops and the run
    records and exits as with SIGTERM to the driver alone (without it: exit 1 after 60 s)."""
    data = base_spec(
        tmp_path, budget={"trials": 2, "max_epochs": 3}, fixed={"sleep": 1.0},
        asha={"enabled": False},
    )  # fmt: skip
    spec = write_spec(tmp_path / "s.yaml", data)
    own = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    driver = start_run(spec, env={**own, "SEARCH_NUM_CPUS": "2"})  # a Ray of its own
    wait_for_a_running_trial(data["storage"], driver)
    os.killpg(driver.pid, signal.SIGTERM)
    out, _ = driver.communicate(timeout=120)

    assert driver.returncode == EXIT_STATUS, out
    assert out.count("trials this run") == 1, out
    _assert_replaced_next_run(spec, data["storage"], {**own, "RAY_ADDRESS": session_ray_address})


def test_processes_started_in_own_process_group_leave_the_callers_and_others_stay() -> None:
    import threading

    from search.run.cluster import own_process_group

    def group_of_child() -> int:
        # a preexec_fn, as Ray's own processes have: Python runs its fork hooks in the child
        child = subprocess.Popen(["sleep", "5"], preexec_fn=lambda: None)  # noqa: PLW1509
        try:
            return os.getpgid(child.pid)
        finally:
            child.kill()
            child.wait()

    other: list[int] = []
    with own_process_group():
        inside = group_of_child()
        thread = threading.Thread(target=lambda: other.append(group_of_child()))
        thread.start()
        thread.join()
    after = group_of_child()
    assert inside != os.getpgrp()
    assert other == [os.getpgrp()] and after == os.getpgrp()


def test_a_trial_sigterm_cut_is_replaced_and_one_that_finished_or_was_pruned_keeps_its_fate() -> (
    None
):
    from search.record.fate import TERMINATED, TrialRecord

    def record(epochs: int, pruned: bool = False) -> TrialRecord:
        rec = TrialRecord("acc", 3, interrupted=TERMINATED, pruned=pruned)
        for epoch in range(1, epochs + 1):
            rec.add({"acc": 0.5, "training_iteration": epoch})
        return rec

    assert record(0).fate() == (TrialState.FAIL, None, INTERRUPTED)
    assert record(2).fate() == (TrialState.FAIL, None, INTERRUPTED)
    assert record(3).fate()[0] == TrialState.COMPLETE
    assert record(2, pruned=True).fate()[0] == TrialState.PRUNED


def test_sigterm_inside_watch_settles_once_then_interrupts_and_the_old_handler_returns(
    request: pytest.FixtureRequest,
) -> None:
    from search.run.signals import Termination

    calls: list[int] = []
    termination = Termination(lambda: calls.append(1))
    before = signal.getsignal(signal.SIGTERM)
    # outside Tune: Python's own SIGINT handler (an in-process Tune run earlier in the session
    # may have left its own, which stops Tune's loop instead of raising)
    sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, sigint))
    with pytest.raises(KeyboardInterrupt), termination.watch():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs here
    assert termination.received and calls == [1]
    assert signal.getsignal(signal.SIGTERM) is before
