"""A trial's process that dies (a segfault, ``os._exit(3)``) fails with what ended it.

Real local Ray, real deaths at epoch 2 of every attempt (``die_at``, ``die_by`` of
:func:`search.testing.curve`). The trial fails with the signal or the exit code and the epoch,
its one retry dies the same way and ends it (not the two of ``faults.max_failures``), and
nothing stays RUNNING. The first trials dying alike stop the run early, naming the log, as a
code error does.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from search.record.resume import INTERRUPTED
from search.specs.schema import load_spec
from search.tuning.bridge import Outcome
from search.tuning.death import EXIT_NOTE, SILENT, Deaths, cause_in, read_since
from search.tuning.fate import EPOCH, NODE_LOST, TrialRecord
from search.tuning.runner import RunOptions, run_study
from search.tuning.stopping import FailFast
from tests.helpers import base_spec, write_spec


def test_a_segfault_and_os_exit_3_at_epoch_2_fail_with_the_signal_and_the_code(
    ray_local: None, tmp_path: Path
) -> None:
    """Two trials at once, one each way; each one's retry dies alike and ends it."""
    data = base_spec(
        tmp_path,
        study="dies",
        budget={"trials": 2, "max_epochs": 3},
        sampler={"name": "grid"},
        space={"die_by": {"choice": ["segfault", "exit"]}},
        fixed={"die_at": 2},
        asha={"enabled": False},
        faults={"max_failures": 2},
    )
    spec = load_spec(write_spec(tmp_path / "dies.yaml", data))
    run_study(spec, RunOptions(results_dir=tmp_path / "results", progress=False))
    trials = optuna.load_study(study_name="dies", storage=data["storage"]).trials
    assert sorted(t.state.name for t in trials) == ["FAIL", "FAIL"]  # none RUNNING
    by = {t.params["die_by"]: t.user_attrs for t in trials}
    again = " (again on retry 1: not retried further)"
    assert by["segfault"]["fail_reason"] == (
        "worker died: SIGSEGV (Segmentation fault) at epoch 2" + again
    )
    assert by["exit"]["fail_reason"] == "worker exited with code 3 at epoch 2" + again
    assert by["segfault"]["retries"] == by["exit"]["retries"] == 1  # max_failures allows 2
    log = Path(by["segfault"]["log"]).read_text()
    assert log.count("Fatal Python error: Segmentation fault") == 2  # both attempts


def test_the_first_trials_dying_alike_stop_the_run_naming_the_log() -> None:
    watch = FailFast(first=3)
    for n in range(3):
        reason = f"worker died: SIGSEGV (Segmentation fault) at epoch {n + 1}"
        watch(Outcome(n, "FAIL", reason, None, code_error=True, log=f"/t/{n}/output.log"))
    assert watch.verdict == (
        "the first 3 trials failed the same way: worker died: SIGSEGV (Segmentation fault) "
        "at epoch 1 (log: /t/0/output.log)"
    )


DIED = "worker died: "


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("*** SIGSEGV received at time=1 on cpu 1 ***\n", f"{DIED}SIGSEGV (Segmentation fault)"),
        ("Fatal Python error: Aborted\n\nStack:\n", f"{DIED}SIGABRT (Aborted)"),
        ("epoch 1\n" + EXIT_NOTE.format(code=3) + "\n", "worker exited with code 3"),
        ("Fatal Python error: Bus error\n" + EXIT_NOTE.format(code=1), "worker exited with code 1"),
        ("a trial's own output, then nothing (SIGKILL)\n", None),
    ],
)  # fmt: skip
def test_the_cause_is_the_last_one_the_log_names(text: str, cause: str | None) -> None:
    assert cause_in(text) == cause


def test_a_retry_reads_only_what_its_own_attempt_wrote(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_text("Fatal Python error: Segmentation fault\n")
    first, offset = read_since(log, 0)
    assert cause_in(first) == "worker died: SIGSEGV (Segmentation fault)"
    with log.open("a") as f:
        f.write("the retry, killed without a word\n")
    second, _ = read_since(log, offset)
    assert cause_in(second) is None


def test_a_retry_that_gets_past_the_epoch_of_the_death_gets_its_retries_back(
    tmp_path: Path,
) -> None:
    """:class:`Deaths` on a stand-in for Tune's trial (the fields it reads and sets)."""
    from ray.exceptions import ActorDiedError

    trial = SimpleNamespace(
        trial_id="t",
        max_failures=2,
        run_metadata=SimpleNamespace(num_failures=1),
        latest_checkpoint_result=None,
    )
    log = tmp_path / "output.log"
    log.write_text("Fatal Python error: Segmentation fault\n")
    deaths = Deaths()
    deaths.result(trial, {EPOCH: 1})
    assert deaths.reason(trial, ValueError("raised"), log) is None  # not a death
    reason = deaths.reason(trial, ActorDiedError(), log)
    assert reason == "worker died: SIGSEGV (Segmentation fault) at epoch 2"
    deaths.hold(trial)
    assert trial.max_failures == 1  # the next failure ends it ...
    deaths.result(trial, {EPOCH: 1})
    assert trial.max_failures == 1
    deaths.result(trial, {EPOCH: 2})
    assert trial.max_failures == 2  # ... unless the retry gets past epoch 2 first
    trial.run_metadata.num_failures = 2
    with log.open("a") as f:
        f.write(EXIT_NOTE.format(code=3) + "\n")
    assert deaths.reason(trial, ActorDiedError(), log) == "worker exited with code 3 at epoch 3"
    deaths.hold(trial)
    trial.run_metadata.num_failures = 3  # the retry resumed from epoch 2, died before a report
    trial.latest_checkpoint_result = SimpleNamespace(metrics={EPOCH: 2})
    with log.open("a") as f:
        f.write(EXIT_NOTE.format(code=3) + "\n")
    again = deaths.reason(trial, ActorDiedError(), log)
    assert again == "worker exited with code 3 at epoch 3 (again on retry 2: not retried further)"


def _stand_in(tmp_path: Path, error: BaseException) -> SimpleNamespace:
    """Tune's trial as :class:`ErrorCallback` reads it: its id, folder and pickled error."""
    import cloudpickle

    (tmp_path / "error.pkl").write_bytes(cloudpickle.dumps(error))
    return SimpleNamespace(
        trial_id="t",
        path=str(tmp_path),
        pickled_error_file=str(tmp_path / "error.pkl"),
        max_failures=0,
        run_metadata=SimpleNamespace(num_failures=1),
        latest_checkpoint_result=None,
    )


class _Bridge:
    """What :class:`ErrorCallback` tells the bridge, kept."""

    def __init__(self) -> None:
        self.told: list[tuple[str, ...]] = []

    def mark_interrupted(self, trial_id: str, cause: str) -> None:
        self.told.append(("interrupted", cause))

    def record_error(self, trial_id: str, message: str, traceback: str | None = None) -> None:
        self.told.append(("error", message))


def test_a_worker_killed_without_a_word_says_so_when_its_log_was_read(tmp_path: Path) -> None:
    from ray.exceptions import ActorDiedError

    from search.tuning.bridge import ErrorCallback

    (tmp_path / "output.log").write_text("epoch 1\n")  # then kill -9: nothing more
    bridge = _Bridge()
    ErrorCallback(bridge).on_trial_error(0, [], _stand_in(tmp_path, ActorDiedError()))
    assert bridge.told == [("error", f"{SILENT} at epoch 1")]


def test_a_trial_whose_node_died_is_interrupted_not_failed(tmp_path: Path) -> None:
    """Ray's GCS words for an actor on a node that died: the world's doing, replaced."""
    from ray.exceptions import RayActorError

    from search.tuning.bridge import ErrorCallback

    lost = RayActorError(error_msg="The actor died because its node has died. Node Id: 7f3a")
    bridge = _Bridge()
    ErrorCallback(bridge).on_trial_error(0, [], _stand_in(tmp_path, lost))
    assert bridge.told[0] == ("interrupted", NODE_LOST)
    record = TrialRecord("acc", 3, interrupted=NODE_LOST)
    record.add({"acc": 0.5, "training_iteration": 1})
    record.error = bridge.told[1][1]
    assert record.fate() == (optuna.trial.TrialState.FAIL, None, INTERRUPTED)
