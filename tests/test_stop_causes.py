"""What each source that stops a run leaves in the study, pinned: the time limit, a fail-fast
verdict, unread space keys, a full disk, a lease another driver took, SIGTERM, Ctrl-C (once
and twice), the device budget and a database outage.

:func:`search.tuning.fit.fit` runs here as a run does, with its real bridge, stoppers,
signal handlers, write-behind storage and study, but Ray Tune's loop is a stand-in
(:class:`FakeTune`) that does what Tune does with a searcher and a stopper: asks for trials,
hands in results (a trial its stopper stops gets its result marked ``done``), asks
``stop_all`` after each step, and ends; the trials still open at the end are left to ``fit``,
as Tune leaves them. No Ray starts, so each case takes milliseconds.

Each case pins what the study records for a trial that trained an epoch and for one that had
not started (state, ``fail_reason``, ``stopped_by``), what ``fit`` returns (its stopped-early
line, the device-hours) or raises, and what the run's :class:`~search.tuning.signals.
Termination` says (the CLI's exit status follows from these: 143 after SIGTERM, 130 after
Ctrl-C, 2 for a stopped-early line, a full disk or an outage, 3 for a study taken over).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pytest

import search.tuning.fit as fit_module
from search.compute.placement import resolve
from search.errors import DiskFullError
from search.record.outage import StorageOutageError
from search.record.resume import INTERRUPTED
from search.record.sampling.samplers import build_sampler
from search.specs.schema import StudySpec, parse_spec
from search.tuning.bridge import OptunaBridge, Outcome
from search.tuning.fate import CODE_ERROR, EPOCH, FAIL_REASON, NO_VALUE, UNREAD
from search.tuning.faults import SYNC_LOGGERS
from search.tuning.options import RunOptions
from search.tuning.signals import Termination
from search.tuning.stopping import StopLedger
from tests.helpers import base_spec

METRIC = "val_accuracy"
CODE = "KeyError: 'lr' (not retried: it fails the same way every time)"


@dataclass
class FakeTune:
    """Ray Tune's loop as :func:`fit` drives it (``tune_controller.py`` of Ray 2.60): what
    ``fit`` handed to its ``Tuner``, and the steps a case takes."""

    bridge: OptunaBridge
    stopper: Any
    world: dict[str, Any]
    case: Callable[[FakeTune], None]
    last: dict[str, dict[str, Any]] = field(default_factory=dict)

    def fit(self) -> None:
        self.case(self)

    def start(self, *trial_ids: str) -> None:
        for trial_id in trial_ids:
            assert self.bridge.suggest(trial_id) is not None
            self.world["started"].append(trial_id)

    def result(self, trial_id: str, epoch: int, **extra: Any) -> bool:
        """One result; whether the run's stopper stopped the trial on it (Tune then marks
        the result done and completes the trial, ``_process_trial_result``)."""
        result = {
            METRIC: 0.5,
            EPOCH: epoch,
            "training_iteration": epoch,
            "time_this_iter_s": 0.01,
            "time_total_s": 0.01 * epoch,
            **extra,
        }
        self.last[trial_id] = result
        if self.stopper(trial_id, result):
            self.bridge.on_trial_complete(trial_id, {**result, "done": True})
            return True
        self.bridge.on_trial_result(trial_id, result)
        return False

    def end(self, trial_id: str) -> None:
        """The trial's function returned: Tune hands its last result in again, done."""
        result = {**self.last[trial_id], "done": True}
        self.stopper(trial_id, result)
        self.bridge.on_trial_complete(trial_id, result)

    def code_error(self, trial_id: str) -> None:
        """The worker's report of an error no retry fixes, then the trial's end."""
        failed = {METRIC: float("nan"), NO_VALUE: True, CODE_ERROR: True, FAIL_REASON: CODE}
        self.result(trial_id, 0, **failed)
        self.end(trial_id)

    def step(self) -> bool:
        """The end of a step of Tune's loop: whether ``stop_all`` ends the run."""
        return bool(self.stopper.stop_all())


@dataclass
class Ran:
    """What a case left: the study's trials by Ray trial id, fit's return or error."""

    trials: dict[str, optuna.trial.FrozenTrial]
    stopped_early: str | None = None
    hours: tuple[float, float, str] | None = None
    error: BaseException | None = None
    termination: Termination = field(default_factory=Termination)


def _run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: Callable[[FakeTune], None],
    holds: Callable[[bool], bool] | None = None,
    **changes: Any,
) -> Ran:
    changes = {"budget": {"trials": 4, "max_epochs": 3}, **changes}
    spec: StudySpec = parse_spec(base_spec(tmp_path, **changes))
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(
        study_name=spec.study, storage=storage, sampler=build_sampler(spec), direction="maximize"
    )
    world: dict[str, Any] = {"inner": storage, "started": []}

    def tuner(
        spec: Any, options: Any, bridge: Any, placement: Any, data: Any, stopper: Any, *rest: Any
    ) -> FakeTune:
        return FakeTune(bridge, stopper, world, case)

    monkeypatch.setattr(fit_module, "init_ray", lambda address: False)
    monkeypatch.setattr(fit_module, "place", lambda spec, data: resolve(spec.resources, {"CPU": 2}))
    monkeypatch.setattr(fit_module, "_tuner", tuner)
    termination = Termination()
    options = RunOptions(results_dir=tmp_path / "results", progress=False)
    ran = Ran({}, termination=termination)
    try:
        _, ran.stopped_early, ran.hours = fit_module.fit(
            spec,
            options,
            study,
            "host/run",
            4,
            None,
            termination,
            fence=holds,  # type: ignore[arg-type]
        )
    except (DiskFullError, StorageOutageError) as exc:
        ran.error = exc
    for name, original in world.get("broken", {}).items():  # the database answers again
        setattr(storage, name, original)
    trials = optuna.load_study(study_name=spec.study, storage=storage).trials
    ran.trials = {world["started"][t.number]: t for t in trials}  # asked in the order started
    return ran


def _fate(trial: optuna.trial.FrozenTrial) -> tuple[str, Any, Any]:
    attrs = trial.user_attrs
    return trial.state.name, attrs.get("fail_reason"), attrs.get("stopped_by")


def _two_started(tune: FakeTune) -> None:
    """``a`` trains its first epoch, ``b`` has started and reported nothing."""
    tune.start("a", "b")
    assert not tune.result("a", 1)
    assert not tune.step()


def test_the_time_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def case(tune: FakeTune) -> None:
        tune.start("a", "b")
        time.sleep(0.05)  # past the limit, however slow the machine
        assert tune.result("a", 1)  # the stopper cuts the trial that reports
        assert tune.step()

    ran = _run(
        tmp_path, monkeypatch, case, budget={"trials": 4, "max_epochs": 3, "time_limit_s": 0.01}
    )
    assert _fate(ran.trials["a"]) == ("PRUNED", None, "time limit")
    assert _fate(ran.trials["b"]) == (
        "FAIL",
        "ended before its first epoch (time limit)",
        "time limit",
    )
    assert (ran.stopped_early, ran.hours, ran.error) == (None, None, None)


def test_the_first_trials_failing_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def case(tune: FakeTune) -> None:
        tune.start("a", "b", "c", "d")
        for trial_id in "abc":
            assert not tune.step()
            tune.code_error(trial_id)
        assert tune.step()

    ran = _run(tmp_path, monkeypatch, case)
    for trial_id in "abc":
        assert _fate(ran.trials[trial_id]) == ("FAIL", CODE, None)
    assert _fate(ran.trials["d"]) == (
        "FAIL",
        "ended before its first epoch (run stopped early)",
        "run stopped early",
    )
    assert ran.stopped_early == f"the first 3 trials failed the same way: {CODE}"
    assert ran.error is None


def test_a_space_key_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def case(tune: FakeTune) -> None:
        tune.start("a", "b")
        assert not tune.result("a", 1, **{UNREAD: ["alpah"]})
        tune.end("a")  # it ended by itself after one epoch
        assert tune.step()

    space = {"x": {"uniform": [0.0, 1.0]}, "alpah": {"uniform": [0.0, 1.0]}}
    ran = _run(tmp_path, monkeypatch, case, space=space)
    assert _fate(ran.trials["a"]) == ("COMPLETE", None, None)
    assert _fate(ran.trials["b"]) == (
        "FAIL",
        "ended before its first epoch (run stopped early)",
        "run stopped early",
    )
    assert ran.stopped_early == (
        "spec: space key 'alpah' is never read by trainable search.testing:curve (remove it, "
        "or give it a when: if only some configs read it)"
    )


def test_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def case(tune: FakeTune) -> None:
        _two_started(tune)
        logging.getLogger(SYNC_LOGGERS[0]).warning(
            "Last sync command failed: OSError: [Errno 28] No space left on device"
        )
        assert tune.step()

    ran = _run(tmp_path, monkeypatch, case)
    assert _fate(ran.trials["a"]) == ("FAIL", INTERRUPTED, "disk full")
    assert _fate(ran.trials["b"]) == ("FAIL", INTERRUPTED, "disk full")
    assert isinstance(ran.error, DiskFullError)
    assert ran.stopped_early is None


def test_a_study_another_driver_took(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held = {"now": True}

    def case(tune: FakeTune) -> None:
        _two_started(tune)
        held["now"] = False
        assert tune.step()

    ran = _run(tmp_path, monkeypatch, case, holds=lambda read: held["now"])
    # settled as interrupted, never told their fate here: the new holder runs the study
    assert _fate(ran.trials["a"]) == ("FAIL", INTERRUPTED, None)
    assert _fate(ran.trials["b"]) == ("FAIL", INTERRUPTED, None)
    assert ran.trials["a"].intermediate_values == {1: 0.5}
    assert (ran.stopped_early, ran.error) == (None, None)


def test_sigterm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def case(tune: FakeTune) -> None:
        _two_started(tune)
        os.kill(os.getpid(), signal.SIGTERM)  # the handler only records it
        assert tune.step()

    ran = _run(tmp_path, monkeypatch, case)
    assert _fate(ran.trials["a"]) == ("FAIL", INTERRUPTED, "SIGTERM")
    assert _fate(ran.trials["b"]) == ("FAIL", INTERRUPTED, "SIGTERM")
    assert (ran.termination.received, ran.termination.interrupted) == (True, False)
    assert (ran.stopped_early, ran.error) == (None, None)


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c(
    presses: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Once: the loop's next step cuts the run; twice: out of Tune's loop at once."""

    def case(tune: FakeTune) -> None:
        _two_started(tune)
        for _ in range(presses):
            os.kill(os.getpid(), signal.SIGINT)
        assert tune.step()

    ran = _run(tmp_path, monkeypatch, case)
    assert _fate(ran.trials["a"]) == ("PRUNED", None, "interrupt")
    assert _fate(ran.trials["b"]) == (
        "FAIL",
        "ended before its first epoch (interrupt)",
        "interrupt",
    )
    assert (ran.termination.received, ran.termination.interrupted) == (False, True)
    assert (ran.stopped_early, ran.error) == (None, None)
    assert capsys.readouterr().err.count("Ctrl-C: stopping") == 1


def test_the_device_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def case(tune: FakeTune) -> None:
        tune.start("a", "b")
        assert tune.result("a", 1, time_this_iter_s=1.0)  # one CPU-second: past the budget
        assert tune.step()

    budget = {"trials": 4, "max_epochs": 3, "cpu_hours": 0.0001}
    ran = _run(tmp_path, monkeypatch, case, budget=budget)
    assert _fate(ran.trials["a"]) == ("PRUNED", None, "budget")
    assert _fate(ran.trials["b"]) == ("FAIL", "ended before its first epoch (budget)", "budget")
    assert ran.hours == (pytest.approx(1 / 3600), 0.0001, "CPU")
    assert (ran.stopped_early, ran.error) == (None, None)


def test_a_database_outage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database stops answering for good: nothing more is written, the trials stay
    RUNNING (the next run settles them), and the run ends in one line."""

    def refuse(*args: Any) -> Any:
        raise RuntimeError("connection refused")

    def case(tune: FakeTune) -> None:
        _two_started(tune)
        tune.bridge.study._storage.outage.limit_s = 0.0  # type: ignore[attr-defined]
        inner = tune.world["inner"]
        names = [n for n in dir(type(inner)) if n.startswith(("get_", "set_", "create_"))]
        tune.world["broken"] = {name: getattr(inner, name) for name in names}
        for name in names:
            setattr(inner, name, refuse)
        tune.end("a")  # its fate cannot be told: Tune's loop gets the error

    ran = _run(tmp_path, monkeypatch, case)
    assert isinstance(ran.error, StorageOutageError)
    assert "did not answer for 0 s (connection refused)" in str(ran.error)
    assert _fate(ran.trials["a"]) == ("RUNNING", None, None)
    assert _fate(ran.trials["b"]) == ("RUNNING", None, None)


def test_one_ledger_names_the_cause_of_the_open_trials_first_source_first(
    tmp_path: Path,
) -> None:
    """The order of :meth:`StopLedger.cause` when several sources fired: the code's verdict,
    what cut the run, the device budget, the time limit; ``interrupt`` when none did."""
    budget = {"trials": 4, "max_epochs": 3, "time_limit_s": 0.01, "cpu_hours": 0.0001}
    spec = parse_spec(base_spec(tmp_path, budget=budget))
    study = optuna.create_study(direction="maximize", study_name=spec.study)
    bridge = OptunaBridge(study, spec.space, {}, metric=METRIC, mode="max", max_epochs=3)
    ledger = StopLedger(spec, budget=4, source="s.yaml")
    ledger.attach(bridge, resolve(spec.resources, {"CPU": 2}))
    causes = [ledger.cause()]
    time.sleep(0.05)  # past the time limit
    causes.append(ledger.cause())
    ledger.wired.meter("t", {"time_this_iter_s": 1.0})  # past the device budget
    causes.append(ledger.cause())
    bridge.cut("SIGTERM")
    causes.append(ledger.cause())
    for n in range(3):
        ledger.fail_fast(Outcome(n, "FAIL", "KeyError: 'lr'", code_error=True))
    causes.append(ledger.cause())
    assert causes == ["interrupt", "time limit", "budget", "SIGTERM", "run stopped early"]
    assert ledger.reason() == ledger.verdict() and ledger.stopped()
    assert ledger.device_hours() == (pytest.approx(1 / 3600), 0.0001, "CPU")
