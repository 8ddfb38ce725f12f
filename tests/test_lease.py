"""One live driver per study: the lease refuses a second one and frees a dead one's at once."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from search.record import lease as lease_module
from search.record.lease import StudyBusyError, StudyLease, held
from search.record.processes import RUN_ENV, named, started_by, stop
from tests.helpers import REPO, base_spec, write_spec
from tests.helpers import lease_of as _lease_of

pytestmark = pytest.mark.slow  # over 5 s here: make test-fast leaves it out

HOLD = """
import sys, time
from search.record.lease import StudyLease
StudyLease(sys.argv[1], "s", sys.argv[2]).acquire()
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(lease_module, "SETTLE_S", 0.05)
    monkeypatch.setattr(lease_module, "RENEW_S", 0.2)
    storage = f"sqlite:///{tmp_path}/l.db"
    optuna.create_study(study_name="s", storage=storage)
    return storage


def _holder(url: str, run: str, *prefix: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", HOLD, url, run],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "SEARCH_LEASE_TTL_S": "1.2"},
    )  # renews every 0.2 s
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_second_driver_is_refused_until_the_first_releases(url: str) -> None:
    first = StudyLease(url, "s", "first")
    assert first.acquire() is None
    with pytest.raises(
        StudyBusyError,
        match=r"study 's' is being run by run first on host .*"
        r"pass --takeover if that driver is dead",
    ):
        StudyLease(url, "s", "second").acquire()
    first.release()
    second = StudyLease(url, "s", "second")
    assert second.acquire()["run"] == "first"  # the released lease it replaced
    assert held(second.current())
    second.release()
    assert not held(second.current())


def test_takeover_and_a_stale_lease(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    live = _holder(url, "live")
    try:
        with pytest.raises(StudyBusyError):
            StudyLease(url, "s", "me").acquire()
        monkeypatch.setattr(lease_module, "TTL_S", 0.5)
        taker = StudyLease(url, "s", "taker")
        taker.acquire(takeover=True)
        taker._stop.set()  # stops renewing, as a hung driver would
        taker._thread.join()
        # a lease this driver watched go unrenewed for TTL_S on its own clock is free
        StudyLease(url, "s", "after").acquire()
        assert not taker.holds() and taker.taken
    finally:
        _kill(live)


def test_a_killed_driver_frees_the_study_at_once(url: str) -> None:
    _kill(_holder(url, "killed"))
    start = time.monotonic()
    StudyLease(url, "s", "next").acquire()  # two renewal periods, not the whole TTL
    assert time.monotonic() - start < 5


@pytest.mark.skipif(
    not shutil.which("unshare") or os.geteuid() != 0, reason="PID namespaces need unshare and root"
)
def test_a_driver_restarted_as_pid_1_again_takes_over_from_its_dead_self(url: str) -> None:
    """A restarted container: the dead driver was PID 1, the new one is PID 1 again."""
    namespaced = ("unshare", "--pid", "--fork", "--mount-proc")
    first = _holder(url, "before-restart", *namespaced)
    recorded = StudyLease(url, "s", "probe").current()
    assert recorded is not None and recorded["pid"] == "1"
    _kill(first)
    second = _holder(url, "after-restart", *namespaced)  # PID 1 too, and alive
    try:
        lease = StudyLease(url, "s", "probe").current()
        assert lease is not None and lease["run"] == "after-restart" and lease["pid"] == "1"
        with pytest.raises(StudyBusyError):  # alive, in a PID namespace of its own: refused
            StudyLease(url, "s", "third").acquire()
    finally:
        _kill(second)


def test_of_two_drivers_that_read_a_free_study_together_the_second_is_refused_at_once(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settles: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        if seconds == lease_module.SETTLE_S:
            settles.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(lease_module.time, "sleep", sleep)
    first, second = StudyLease(url, "s", "first"), StudyLease(url, "s", "second")
    stale, fresh = second.current(), second.current
    reads: list[int] = []

    def current() -> dict | None:  # its first read comes before the first driver writes
        reads.append(1)
        return stale if len(reads) == 1 else fresh()

    monkeypatch.setattr(second, "current", current)
    first.acquire()
    with pytest.raises(StudyBusyError, match="was just taken by run first"):
        second.acquire()
    assert first.current()["run"] == "first"  # the second wrote nothing over it
    assert settles == []  # a compare-and-set in one transaction: no settling wait
    first.release()


LOCK = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("COMMIT")
"""


def test_a_database_locked_by_another_process_is_named_as_such(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A second process holds ``BEGIN EXCLUSIVE``: the renewals say the database is locked,
    never Optuna's "invalid data in the commit", and say so again once it frees."""
    monkeypatch.setattr("search.record.storage.SQLITE_TIMEOUT_S", 0.1)  # busy timeout
    monkeypatch.setattr(lease_module, "LOCKED_NOTE_S", 1.0, raising=False)
    lease = StudyLease(url, "s", "me")
    lease.acquire()
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCK, str(tmp_path / "l.db"), "2.0"], stdout=subprocess.PIPE
    )
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == b"locked"
        with caplog.at_level("WARNING", logger=lease_module.__name__):
            assert locker.wait(timeout=30) == 0
            time.sleep(1.0)  # a renewal or two after the lock is gone
    finally:
        locker.kill()
        lease.release()
    lines = [r.getMessage() for r in caplog.records]
    locked = [line for line in lines if line.startswith("the study's database was locked for")]
    assert locked and locked[0].endswith("s; the lease is renewed when it frees"), lines
    assert len(locked) <= 3, lines  # at most one line per LOCKED_NOTE_S, not one per renewal
    assert any(line.startswith("the study's lease is renewed again, after") for line in lines)
    assert not any("invalid data" in line for line in lines), lines


KEEP = """
import subprocess, sys, time
from search.record.lease import StudyLease
from search.record.processes import mark
lease = StudyLease(sys.argv[1], "s", "dies")
lease.acquire()
mark("dies")  # as the runner does before it starts Ray: what it starts carries the run id
child = subprocess.Popen(["sleep", "120"], start_new_session=True)  # outlives a killpg
lease.keep([child.pid])
print(child.pid, flush=True)
time.sleep(600)
"""


def test_stop_kills_a_recorded_process_and_never_a_pid_that_another_process_holds() -> None:
    sleeper = subprocess.Popen(["sleep", "120"], env={**os.environ, RUN_ENV: "mine"})
    try:
        deadline = time.monotonic() + 10  # /proc shows the new environment once exec is done
        while not started_by(sleeper.pid, "mine") and time.monotonic() < deadline:
            time.sleep(0.05)
        (recorded,) = named([sleeper.pid])
        reused = [recorded[0], str(int(recorded[1]) + 1)]  # the pid, started at another time
        assert stop([reused], "mine") == 0
        assert stop([recorded], "another run") == 0  # not started by that run
        assert sleeper.poll() is None
        assert stop([recorded], "mine") == 1
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert stop([recorded], "mine") == 0  # gone: nothing to kill
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_next_driver_stops_what_a_killed_one_recorded_and_says_how_many(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", KEEP, url],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "SEARCH_LEASE_TTL_S": "1.2"},
    )
    assert holder.stdout is not None
    child = int(holder.stdout.readline())
    try:
        recorded = StudyLease(url, "s", "probe").current()
        assert recorded is not None and recorded["ray"] == named([child])
        _kill(holder)  # its own process group: the child, in a session of its own, stays
        assert lease_module.proc(child)[0] == str(child)
        with caplog.at_level("WARNING", logger=lease_module.__name__):
            StudyLease(url, "s", "next").acquire()
        assert _gone_soon(child)
        assert any(
            r.getMessage().startswith("stopped 1 process of the local Ray that the dead run dies")
            for r in caplog.records
        ), [r.getMessage() for r in caplog.records]
    finally:
        stop(named([child]), "dies")


def test_a_forged_lease_never_makes_the_next_run_kill_a_process_it_names(url: str) -> None:
    """Whoever can write the storage writes a lease whose holder looks dead on this machine
    and whose Ray is an unrelated process (its pid and start time, as ``/proc`` tells anyone):
    the next driver takes the study and kills nothing."""
    import socket

    bystander = subprocess.Popen(["sleep", "120"])  # this user's, not started by any run
    try:
        forged = {
            "run": "forged",
            "host": socket.gethostname(),
            "boot": lease_module._boot_id(),
            "pid": "4194303",  # no such process: the holder looks gone
            "start": "1",
            "renewed": time.time() - 60,
            "ray": named([bystander.pid]),
        }
        storage = optuna.storages.RDBStorage(url)
        storage.set_study_user_attr(storage.get_study_id_from_name("s"), "driver", forged)
        StudyLease(url, "s", "next").acquire()
        time.sleep(0.2)
        assert bystander.poll() is None, "the forged lease made the driver kill a bystander"
    finally:
        bystander.kill()
        bystander.wait()


def _gone_soon(pid: int, within_s: float = 60.0) -> bool:
    """Whether ``pid`` is gone, or a zombie (killed, not reaped yet), within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


AGENTS = ("DashboardAgent", "RuntimeEnvAgent")


def _agents_recorded(db: Path, driver: subprocess.Popen, within_s: float = 120) -> list[list[str]]:
    """The lease's Ray processes, once they include Ray's two agents."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and driver.poll() is None:
        recorded = _lease_of(db).get("ray") or []
        names = " ".join(_cmdline(pid) for pid, _ in recorded)
        if all(agent in names for agent in AGENTS):
            return recorded
        time.sleep(0.2)
    raise AssertionError(f"the driver recorded no Ray agents: {_lease_of(db)}")


def _watchers(driver: int) -> list[int]:
    """The pids of the watchers (search/record/processes.py) that ``driver`` started."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and "processes.py" in _cmdline(entry.name):
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            found += [int(entry.name)] if parent == driver else []
    return found


def _driver(spec: Path, results: Path) -> subprocess.Popen[bytes]:
    """``search run`` with a local Ray of its own (1 CPU), in a session of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "search", "run", str(spec), "--results", str(results)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "SEARCH_NUM_CPUS": "1"},
    )


def test_a_killed_drivers_ray_agents_die_with_it_whoever_runs_next(tmp_path: Path) -> None:
    """``kill -9`` of a driver that started its own Ray: with no next run on this machine
    (the study taken over from another host, or never run again), its watcher stops every
    process of that Ray, the agents too. Before, the two agents (about 200 MB) stayed up."""
    data = base_spec(tmp_path, study="gone", budget={"trials": 2, "max_epochs": 2})
    data["fixed"] = {"sleep": 0.5}
    driver = _driver(write_spec(tmp_path / "gone.yaml", data), tmp_path / "r")
    recorded: list[list[str]] = []
    try:
        recorded = _agents_recorded(tmp_path / "optuna.db", driver)
        assert len(_watchers(driver.pid)) == 1
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        assert all(_gone_soon(int(pid)) for pid, _ in recorded), [
            _cmdline(pid) for pid, start in recorded if lease_module.proc(pid) == (pid, start)
        ]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for pid, start in recorded:
            if lease_module.proc(pid) == (pid, start):
                os.kill(int(pid), signal.SIGKILL)


def test_the_next_run_stops_the_ray_agents_a_killed_driver_left(
    ray_local: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``kill -9`` of a driver that started its own Ray, and of its watcher: its agents stay,
    the next run on the machine stops them (by the pids and start times its lease recorded)
    and completes."""
    from search.specs.schema import load_spec
    from search.tuning.runner import RunOptions, run_study

    data = base_spec(
        tmp_path, study="left", budget={"trials": 2, "max_epochs": 2}, fixed={"sleep": 0.5}
    )
    spec = write_spec(tmp_path / "left.yaml", data)
    driver = subprocess.Popen(
        [sys.executable, "-m", "search", "run", str(spec), "--results", str(tmp_path / "r")],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "SEARCH_NUM_CPUS": "1"},
    )  # fmt: skip
    recorded: list[list[str]] = []
    try:
        recorded = _agents_recorded(tmp_path / "optuna.db", driver)
        dead = _lease_of(tmp_path / "optuna.db")["run"]
        for watcher in _watchers(driver.pid):  # the backstop, for a watcher killed too
            os.kill(watcher, signal.SIGKILL)
        os.kill(driver.pid, signal.SIGKILL)  # the driver alone, as kill -9 PID does
        driver.wait()
        time.sleep(1.0)  # its raylet and GCS go with it; the agents do not
        left = [r for r in recorded if lease_module.proc(r[0]) == tuple(r)]
        assert any(agent in _cmdline(pid) for pid, _ in left for agent in AGENTS), left
        assert not [pid for pid, _ in left if "raylet" in _cmdline(pid)]  # gone with it
        monkeypatch.setattr(lease_module, "RENEW_S", 0.5)  # the dead holder's renewals
        with caplog.at_level("WARNING", logger=lease_module.__name__):
            run_study(load_spec(spec), RunOptions(results_dir=tmp_path / "r", progress=False))
        assert all(_gone_soon(int(pid)) for pid, _ in left)
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stopped")]
        assert len(said) == 1 and said[0].endswith(f"the dead run {dead} left on this machine")
        agents = sum(any(a in _cmdline(pid) for a in AGENTS) for pid, _ in left)
        assert agents <= int(said[0].split()[1]) <= len(left), (said, left)
        trials = optuna.load_study(study_name="left", storage=data["storage"]).trials
        assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
        fates = [(t.number, t.state.name, t.user_attrs.get("search/fail_reason")) for t in trials]
        # the budget is spent: ASHA may prune the weaker of the two at epoch 1
        assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials) == 2, fates
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for pid, start in recorded:  # whatever this test's own driver left, should the run not
            if lease_module.proc(pid) == (pid, start):
                os.kill(int(pid), signal.SIGKILL)


def test_a_trial_asked_for_after_the_study_was_taken_never_runs_nor_counts(
    tmp_path: Path,
) -> None:
    """The window between the bridge's check of the lease and its ``ask``: a driver paused
    there wakes to a study another driver took; the trial it just made is failed as
    interrupted (replaced, not counted) and no config is handed to Tune."""
    from ray.tune.search import Searcher

    from search.record.resume import INTERRUPTED, counts
    from search.specs.space import Param
    from search.tuning.bridge import TAKEN, OptunaBridge

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/b.db", study_name="b")
    answers = iter([True, False])  # holds before the ask, taken after it
    bridge = OptunaBridge(
        study,
        {"x": Param.model_validate({"uniform": [0.0, 1.0]})},
        {},
        metric="acc",
        mode="max",
        max_epochs=2,
        fence=lambda read: next(answers, False),
    )
    assert bridge.suggest("ray-1") is Searcher.FINISHED
    (trial,) = study.get_trials()
    assert trial.state.name == "FAIL" and trial.user_attrs["fail_reason"] == INTERRUPTED
    assert not counts(trial) and bridge.cut_by == TAKEN
    assert bridge.suggest("ray-2") is Searcher.FINISHED and len(study.get_trials()) == 1
