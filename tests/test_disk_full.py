"""A full disk ends a command in one line naming it, exit 2, and a run that meets one loses
no budget: real errors from a real small filesystem (a tmpfs, mounted where the test may;
skipped where it may not)."""

from __future__ import annotations

import errno
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

from search.cli import app, full_disk_is_one_line
from search.errors import DiskFullError, disk_full
from search.record.resume import INTERRUPTED
from search.record.storage import full_disk_error, open_storage
from tests.helpers import REPO, base_spec, wait_for_a_running_trial, write_spec

FULL = "free space and run the same command again"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, empty."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _fill(folder: Path) -> OSError:
    """Fills ``folder``'s filesystem; returns the ``OSError`` the last write met."""
    with (folder / "filler").open("wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError as exc:
            return exc
    raise AssertionError("unreachable")


def test_disk_full_recognizes_real_errors(disk: Path) -> None:
    db = sqlite3.connect(disk / "x.db")
    db.execute("CREATE TABLE t (b BLOB)")
    db.commit()
    written = _fill(disk)
    assert written.errno == errno.ENOSPC and disk_full(written) == ""
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full") as info:
        db.execute("INSERT INTO t VALUES (?)", (b"\1" * 200_000,))
        db.commit()
    assert disk_full(info.value) == ""
    named = OSError(errno.ENOSPC, "No space left on device", str(disk / "f"))
    assert disk_full(named) == str(disk / "f")
    assert disk_full(sqlite3.OperationalError("database is locked")) is None
    assert disk_full(OSError(errno.EACCES, "Permission denied")) is None
    # No file named: the place whose filesystem is full, not the first one given.
    assert str(full_disk_error(written, ["sqlite:////elsewhere/s.db", str(disk)])) == (
        f"no space left on device for {disk}: {FULL}"
    )


def test_a_study_on_a_full_disk_is_one_line_naming_its_storage(disk: Path) -> None:
    """Optuna says "invalid data in the commit"; the line says the disk is full."""
    url = f"sqlite:///{disk}/s.db"
    study = optuna.create_study(study_name="s", storage=open_storage(url))
    _fill(disk)
    with pytest.raises(DiskFullError) as info, full_disk_is_one_line(url, disk / "results"):
        for _ in range(20):
            study.set_user_attr("big", "x" * 100_000)
            study.tell(study.ask(), 1.0)
    assert str(info.value) == f"no space left on device for {url}: {FULL}"


def test_a_command_whose_results_folder_is_full_ends_in_one_line(
    disk: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=open_storage(url))
    study.tell(study.ask({"x": optuna.distributions.FloatDistribution(0, 1)}), 0.5)
    _fill(disk)
    result = CliRunner().invoke(app, ["report", "s", "--storage", url, "--results", str(disk)])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: no space left on device for {disk}: {FULL}"


def test_the_study_writer_says_a_full_disk_once_with_its_cause(
    disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from search.record.writer import OrderedWriter

    storage = open_storage(f"sqlite:///{disk}/s.db")
    study = optuna.create_study(study_name="s", storage=storage)
    trial_id = study.ask()._trial_id
    _fill(disk)
    writer = OrderedWriter(storage)
    with caplog.at_level("WARNING", logger="search.record.writer"):
        for step in range(5):
            writer.put(trial_id, "set_trial_user_attr", (f"k{step}", "x" * 300_000))
        with pytest.raises(RuntimeError, match="5 study write"):
            writer.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "search.record.writer"]
    assert len(lines) == 1 and lines[0].endswith("failed: database or disk is full"), lines


def test_a_report_that_does_not_fit_leaves_no_cut_page_and_takes_no_space(
    disk: Path, tmp_path: Path
) -> None:
    """The page (plotly.js embedded, megabytes) meets ENOSPC: no half page, the space back."""
    import os

    from search.report.html import write_report

    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db")
    study.tell(study.ask({"x": optuna.distributions.FloatDistribution(0, 1)}), 0.5)
    (disk / "s").mkdir()
    free = os.statvfs(disk).f_bfree
    with pytest.raises(OSError) as info:
        write_report(study, disk, pngs=False)
    assert disk_full(info.value) is not None
    assert list((disk / "s").iterdir()) == []  # neither report.html nor its part
    assert os.statvfs(disk).f_bfree == free


def _run(spec: Path, results: Path) -> list[str]:
    return [sys.executable, "-m", "search", "run", str(spec), "--results", str(results)]


@pytest.mark.slow
@pytest.mark.usefixtures("joins_session_ray")
def test_a_run_whose_results_fill_stops_in_one_line_and_its_cut_trials_are_replaced(
    disk: Path, tmp_path: Path
) -> None:
    """``--results`` fills while the study's disk has room: the trials' checkpoints meet
    ENOSPC. Not the configs' fault: no trial is FAIL by it, none is retried into the budget."""
    data = base_spec(
        tmp_path, budget={"trials": 3, "max_epochs": 4}, fixed={"sleep": 0.5},
        faults={"checkpoint_every_s": 0}, asha={"enabled": False},
    )  # fmt: skip
    spec = write_spec(tmp_path / "s.yaml", data)
    driver = subprocess.Popen(
        _run(spec, disk), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_for_a_running_trial(data["storage"], driver)
    _fill(disk)
    out, err = driver.communicate(timeout=180)

    assert driver.returncode == 2, out + err
    assert err.strip().splitlines()[-1] == f"error: no space left on device for {disk}: {FULL}"
    assert "Traceback" not in out + err and "Errno 28" not in out + err, out + err
    trials = optuna.load_study(study_name="t", storage=data["storage"]).trials
    assert not [t for t in trials if not t.state.is_finished()]
    cut = [t for t in trials if t.user_attrs.get("fail_reason") == INTERRUPTED]
    assert cut and all(t.state == TrialState.FAIL and not t.user_attrs["retries"] for t in cut)
    assert not [t for t in trials if t.state == TrialState.FAIL and t not in cut]

    (disk / "filler").unlink()  # space freed: the same command goes on
    again = subprocess.run(_run(spec, disk), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    after = optuna.load_study(study_name="t", storage=data["storage"]).trials
    done = [t for t in after if t.state == TrialState.COMPLETE]
    assert len(done) == 3 and len(after) == 3 + len(cut)  # the budget, the cut ones replaced


def test_the_world_cuts_a_trial_its_own_doing_fails_it_whatever_cuts_the_run_after() -> None:
    """One rule (search/tuning/fate.py): a full disk's error is the world's, a NaN the
    trial's own, and the user's own limits count."""
    from search.tuning.fate import DISK_FULL, FAIL_REASON, TrialRecord

    def record(epochs: int, **kw: object) -> TrialRecord:
        rec = TrialRecord("acc", 3, **kw)  # type: ignore[arg-type]
        for epoch in range(1, epochs + 1):
            rec.add({"acc": 0.5, "training_iteration": epoch})
        return rec

    enospc = "OSError: [Errno 28] No space left on device"
    assert record(1, interrupted=DISK_FULL, error=enospc, errored=True).fate() == (
        TrialState.FAIL, None, INTERRUPTED,
    )  # fmt: skip
    assert record(0, interrupted=DISK_FULL).fate() == (TrialState.FAIL, None, INTERRUPTED)
    nan = TrialRecord("acc", 3, interrupted=DISK_FULL)
    nan.add({"acc": float("nan"), "training_iteration": 1, FAIL_REASON: "acc is nan"})
    assert nan.fate() == (TrialState.FAIL, None, "acc is nan")
    assert record(2, interrupted=DISK_FULL, pruned=True).fate()[0] == TrialState.PRUNED
    assert record(3, interrupted=DISK_FULL).fate()[0] == TrialState.COMPLETE
    assert record(2, interrupted="time limit").fate()[0] == TrialState.PRUNED
    assert record(1, error="ValueError: bad", errored=True).fate()[2] == "ValueError: bad"


def test_a_cut_run_settles_its_open_trials_as_interrupted_uncounted_and_starts_none() -> None:
    from ray.tune.search import Searcher

    from search.record.resume import counts
    from search.specs.space import Param
    from search.tuning.bridge import OptunaBridge
    from search.tuning.fate import DISK_FULL

    study = optuna.create_study(direction="maximize")
    space = {"x": Param.model_validate({"uniform": [0.0, 1.0]})}
    bridge = OptunaBridge(study, space, {}, metric="acc", mode="max", max_epochs=3)
    for trial_id in ("full", "other", "raised"):
        bridge.suggest(trial_id)
        bridge.on_trial_result(trial_id, {"acc": 0.5, "training_iteration": 1})
    bridge.on_trial_complete("raised", error=True)
    bridge.record_error("raised", "ValueError: bad")  # its own doing, before the disk filled
    bridge.on_trial_complete("full", error=True)  # its error, next, is the full disk
    bridge.cut(DISK_FULL, "full")

    assert bridge.suggest("later") == Searcher.FINISHED
    # Tune may still hand in a result of a trial the cut settled (seen after a SIGTERM):
    bridge.on_trial_result("other", {"acc": 0.7, "training_iteration": 2})
    reasons = {t.user_attrs["ray_trial_id"]: t.user_attrs["fail_reason"] for t in study.trials}
    assert reasons == {"full": INTERRUPTED, "other": INTERRUPTED, "raised": "ValueError: bad"}
    assert [counts(t) for t in study.trials] == [False, False, True]


def test_a_full_disk_in_rays_sync_warning_stops_the_run_and_the_warning_is_not_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    from search.tuning.faults import SYNC_LOGGERS, DiskFault

    cut: list[str | None] = []
    fault = DiskFault(cut.append)
    logger = logging.getLogger(SYNC_LOGGERS[0])
    with caplog.at_level("WARNING", logger=SYNC_LOGGERS[0]), fault.watching_ray_logs():
        logger.warning("Last sync command failed: OSError: [Errno 28] Error writing bytes")
        logger.warning("Last sync command failed: ConnectionError")
    logger.warning("outside the run: [Errno 28]")
    assert [r.getMessage() for r in caplog.records] == [
        "Last sync command failed: ConnectionError",
        "outside the run: [Errno 28]",
    ]
    assert cut == [None] and fault.verdict is not None
    with pytest.raises(DiskFullError, match="for /results: free space"):
        fault.raise_if_met(["/results"])


# A driver drops the results of two tasks unread, as Tune drops a cut trial's last ``train()``:
# one met a real full disk, one a plain error. Ray logs each as "Unhandled error" with the
# task's remote traceback (a trial's: some 15 frames of Tune) when the result is freed.
UNHANDLED = """
import sys, time
import ray
from search.compute.cluster import init_ray

@ray.remote
def write(path):
    with open(path, "wb") as fh:
        fh.write(b"x" * 4_000_000)

@ray.remote
def fails():
    raise ValueError("a plain error")

init_ray(sys.argv[1])
refs = [write.remote(sys.argv[2]), fails.remote()]
time.sleep(5)  # both ran (unread: ray.wait would count as read)
del refs
time.sleep(1)
ray.shutdown()
"""


@pytest.mark.slow
def test_rays_stack_of_a_task_that_met_the_full_disk_stays_off_the_console(
    disk: Path, session_ray_address: str
) -> None:
    """Before, the run's one line came with Ray's "Unhandled error" and the trial's remote
    traceback on stderr; the full disk is said once, by the run's line."""
    _fill(disk)
    done = subprocess.run(
        [sys.executable, "-c", UNHANDLED, session_ray_address, str(disk / "checkpoint")],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ValueError: a plain error" in done.stderr  # the control: Ray does say it here
    assert "Errno 28" not in done.stderr and "No space left" not in done.stderr, done.stderr
    assert "in write\n" not in done.stderr and "fh.write" not in done.stderr, done.stderr
