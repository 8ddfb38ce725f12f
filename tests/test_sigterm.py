"""SIGTERM to the driver (Kubernetes), or to its process group (Slurm), ends a run as Ctrl-C
does, and loses no budget."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from search.record.resume import INTERRUPTED
from search.tuning.signals import EXIT_STATUS
from tests.helpers import REPO, base_spec, start_run, wait_for_a_running_trial, write_spec


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


@pytest.mark.slow
@pytest.mark.usefixtures("joins_session_ray")
@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_prints_its_line_and_the_summary_and_exits_130(tmp_path: Path, presses: int) -> None:
    """Ctrl-C (SIGINT to the terminal's process group): one line at once, every trial settled,
    the summary, exit 130. A second Ctrl-C stops at once, still with one line and 130."""
    from search.tuning.signals import INTERRUPT_EXIT_STATUS, INTERRUPT_LINE

    data = base_spec(
        tmp_path, budget={"trials": 2, "max_epochs": 3}, fixed={"sleep": 1.0},
        asha={"enabled": False},
    )  # fmt: skip
    spec = write_spec(tmp_path / "s.yaml", data)
    driver = start_run(spec)
    wait_for_a_running_trial(data["storage"], driver)
    for _ in range(presses):
        os.killpg(driver.pid, signal.SIGINT)
        time.sleep(0.3)
    out, _ = driver.communicate(timeout=120)

    assert driver.returncode == INTERRUPT_EXIT_STATUS, out
    assert "Traceback" not in out and "Aborted" not in out, out
    if presses == 1:
        assert out.count(INTERRUPT_LINE) == 1, out
        assert out.count("trials this run") == 1, out  # the summary, once
        trials = optuna.load_study(study_name="t", storage=data["storage"]).trials
        assert trials and all(t.state.is_finished() for t in trials)
    else:  # the second press lands in the cut or after it: at once, one line either way
        lines = [line for line in out.splitlines() if "Ctrl-C" in line]
        assert 1 <= len(lines) <= 2 and lines[0] == INTERRUPT_LINE, out


def test_processes_started_in_own_process_group_leave_the_callers_and_others_stay() -> None:
    import threading

    from search.compute.cluster import own_process_group

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
    from search.tuning.fate import TERMINATED, TrialRecord

    def record(epochs: int, pruned: bool = False) -> TrialRecord:
        rec = TrialRecord("acc", 3, interrupted=TERMINATED, pruned=pruned)
        for epoch in range(1, epochs + 1):
            rec.add({"acc": 0.5, "training_iteration": epoch})
        return rec

    assert record(0).fate() == (TrialState.FAIL, None, INTERRUPTED)
    assert record(2).fate() == (TrialState.FAIL, None, INTERRUPTED)
    assert record(3).fate()[0] == TrialState.COMPLETE
    assert record(2, pruned=True).fate()[0] == TrialState.PRUNED


def test_signals_inside_watch_only_set_flags_act_cuts_once_and_the_old_handlers_return() -> None:
    from search.tuning.signals import Termination

    calls: list[str] = []
    termination = Termination(lambda: calls.append("term"), lambda: calls.append("int"))
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with termination.watch():
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, and only sets a flag
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert termination.received and termination.interrupted and calls == []
        assert termination.act() == "SIGTERM" and calls == ["term", "int"]
        assert termination.act() == "SIGTERM" and calls == ["term", "int"]  # once each
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C: at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


ROUNDS = 12


def test_sigterm_inside_a_storage_call_never_blocks_and_the_loop_makes_the_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM lands while the driver's main thread is inside a storage transaction (a hook
    on every SQL statement of the study's engine sends it, at a different statement each
    round): the handler returns at once, the transaction goes on, and the run's loop then
    settles every running trial as cut by SIGTERM. A handler that wrote to the study there
    waited for the interrupted transaction's lock, or broke it, and lost the cut."""
    import sqlalchemy as sa

    from search.record.storage import open_storage, rdb_backend
    from search.record.writeback import WriteBehindStorage
    from search.specs.space import Param
    from search.tuning.bridge import OptunaBridge
    from search.tuning.fate import TERMINATED
    from search.tuning.signals import Termination

    monkeypatch.setattr("search.record.storage.SQLITE_TIMEOUT_S", 2)  # a lock waits 2 s
    storage = open_storage(f"sqlite:///{tmp_path}/s.db")
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    statements: list[int] = []  # counts down to the statement the signal lands in

    def hook(*_: object) -> None:
        main = threading.current_thread() is threading.main_thread()
        if main and statements and statements[0] > 0:
            statements[0] -= 1
            if statements[0] == 0:
                os.kill(os.getpid(), signal.SIGTERM)  # handled right here, mid-transaction

    sa.event.listen(rdb_backend(storage).engine, "after_cursor_execute", hook)
    space = {"x": Param.model_validate({"uniform": [0.0, 1.0]})}
    raised: list[int] = []  # rounds whose handler raised out of the storage call
    lost: list[tuple[int, list[tuple[str, bool]]]] = []  # rounds whose cut was not recorded
    for landing in range(1, ROUNDS + 1):
        before = len(study.get_trials())
        driver = optuna.Study(study_name="s", storage=WriteBehindStorage(storage))
        bridge = OptunaBridge(driver, space, {}, metric="acc", mode="max", max_epochs=3)
        termination = Termination()
        termination.on_signal = lambda bridge=bridge: bridge.cut(TERMINATED)
        try:
            with termination.watch():
                statements[:] = [landing]
                for trial_id in ("a", "b"):  # asks: creating a trial is a transaction
                    bridge.suggest(f"{landing}{trial_id}")
                    bridge.on_trial_result(f"{landing}{trial_id}", {"acc": 0.5})
                driver.get_trials()
                while not termination.received:  # past the last statement: at the next
                    statements[:] = [1]
                    driver.get_trials()
                assert termination.act() == "SIGTERM"  # the loop's step: the cut, here
        except KeyboardInterrupt:  # a handler that raised: the storage call it left was cut
            raised.append(landing)
        finally:
            with contextlib.suppress(RuntimeError):  # writes that failed, in `errors`
                driver._storage.close()
        states = [
            (t.state.name, t.user_attrs.get("fail_reason") == INTERRUPTED)
            for t in study.get_trials()[before:]
        ]
        if states != [("FAIL", True), ("FAIL", True)]:
            lost.append((landing, states))
    assert raised == [] and lost == [], (raised, lost)
