"""``search slurm``: a study as a SLURM batch job, on a real single-node SLURM (Debian's
``slurmctld``, ``slurmd`` and ``munge``, which ``.ci/run`` installs), and the script's text.

The jobs' trials are the ``curve`` trainable's, held at a gate (``hold_file``) where a test
needs a trial RUNNING when it cancels a job or the time limit strikes: what the tests assert is
the record's truth, never how far trials got in some seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import GATED_FAULTS, base_spec, stored_study, write_spec
from tests.slurm_cluster import SlurmCluster, have_slurm, single_node_slurm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if not have_slurm():
        if os.environ.get("CI"):
            pytest.fail("SLURM and munge are missing: .ci/run installs them")
        pytest.skip("SLURM and munge not installed (apt-get install slurmctld slurmd munge)")
    with single_node_slurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def _study_folder(tmp_path: Path, name: str, trials: int, hold_from: int, epochs: int = 3) -> Path:
    """A folder to submit from, with ``s.yaml``: study ``name``, its storage and results in
    the folder (the shared filesystem of this one-node cluster), trials from ``hold_from`` on
    waiting for the file ``gate`` before their first epoch (no stall: ``GATED_FAULTS``)."""
    work = tmp_path / name
    work.mkdir()
    fixed = {"sleep": 0.2, "hold_file": str(work / "gate"), "hold_from": hold_from}
    data = base_spec(
        work, study=name, storage="sqlite:///results/optuna.db", fixed=fixed,
        budget={"trials": trials, "max_epochs": epochs}, faults=GATED_FAULTS,
    )  # fmt: skip
    write_spec(work / "s.yaml", data)
    return work


def _submit(cluster: SlurmCluster, work: Path, *options: str) -> str:
    """``search slurm s.yaml OPTIONS`` from ``work``; returns the job's id."""
    done = subprocess.run(
        [sys.executable, "-m", "search", "slurm", "s.yaml", "--cpus-per-node", "2", *options],
        cwd=work, env=cluster.env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("submitted job "), done.stdout
    return first.split()[2]


def _trials(work: Path, name: str) -> list[Any]:
    study = stored_study(f"sqlite:///{work}/results/optuna.db", name)
    return [] if study is None else study.trials


def _wait(cluster: SlurmCluster, job_id: str, check: Any, what: str) -> None:
    """Polls until ``check()`` holds; fails with the job's output once the job is gone
    without it (no time budget: the job's own time limit bounds the wait)."""
    import time

    while not check():
        if cluster.job_state(job_id) is None and not check():
            out = "\n".join(p.read_text()[-4000:] for p in cluster.root.parent.glob("**/*.out"))
            pytest.fail(f"job {job_id} ended before {what}:\n{out}")
        time.sleep(0.5)


def _limit_soon(cluster: SlurmCluster, job_id: str) -> None:
    """Sets a running job's time limit to its run time so far plus 2 whole minutes: 60 to
    120 s left, so SLURM's signal (a 30 s grace, checked every 30 s) strikes in the next ones."""
    shown = cluster.command("scontrol", "show", "job", job_id)
    found = re.search(r"\bRunTime=(?:(\d+)-)?(\d+):(\d+):(\d+)", shown)
    assert found, shown
    days, hours, minutes, _ = (int(part or 0) for part in found.groups())
    ran = (days * 24 + hours) * 60 + minutes
    cluster.command("scontrol", "update", f"JobId={job_id}", f"TimeLimit={ran + 2}")


def _settled(trials: list[Any]) -> list[Any]:
    return [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]


def _assert_study_whole(trials: list[Any], budget: int, kept: list[Any]) -> None:
    """The budget's trials finished, none RUNNING, no config finished twice, the cut ones
    FAIL interrupted, and the trials finished before the stop kept as they were."""
    from search.record.resume import INTERRUPTED

    settled = _settled(trials)
    assert len(settled) == budget, [(t.number, t.state.name) for t in trials]
    assert all(t.state.is_finished() for t in trials)
    others = [t for t in trials if t not in settled]
    assert all(t.user_attrs.get("fail_reason") == INTERRUPTED for t in others), others
    configs = [tuple(sorted(t.params.items())) for t in settled]
    assert len(set(configs)) == len(configs)
    by_number = {t.number: t for t in trials}
    for before in kept:
        after = by_number[before.number]
        assert (after.state, after.value, after.params) == (
            before.state,
            before.value,
            before.params,
        )


def test_two_jobs_share_a_node_and_a_time_limit_requeues_the_study(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Two studies as two jobs on one node at once (their Rays on ports and folders of their
    own); the first one's time limit stops it as SIGTERM does, the job requeues itself, and its
    next start finishes the study."""
    long = _study_folder(tmp_path, "long", trials=5, hold_from=2)
    short = _study_folder(tmp_path, "short", trials=3, hold_from=1)
    # The long one's limit is cut to its run time + 2 minutes only once the short one is done:
    # a fixed 1-minute limit struck on a slow hour before its Ray was up, start after start.
    long_id = _submit(slurm, long, "--time", "10", "--grace", "30", "--requeue")
    short_id = _submit(slurm, short)

    def both_running() -> bool:
        return all(
            any(t.state.name == "RUNNING" for t in _trials(work, work.name))
            for work in (long, short)
        )

    _wait(slurm, short_id, both_running, "both studies had a trial running at once")
    (short / "gate").touch()
    slurm.wait_gone(short_id)
    _assert_study_whole(_trials(short, "short"), 3, [])

    # The long one's gate stays shut: its time limit stops it, and the job goes back to the
    # queue by itself; SLURM starts it again once its credential expired (5 s here).
    _limit_soon(slurm, long_id)
    _wait(slurm, long_id, lambda: slurm.restarts(long_id) >= 1, "the job requeued itself")
    # The first start's trials, by the driver that made them: on a slow hour the next start
    # may already run trials of its own (held at the gate) when the requeue is seen.
    trials = _trials(long, "long")
    driver = min(trials, key=lambda t: t.number).user_attrs["driver"]
    first = [t for t in trials if t.user_attrs.get("driver") == driver]
    assert first and all(t.state.is_finished() for t in first)  # nothing of it left RUNNING
    (long / "gate").touch()
    # Its next start gets 10 minutes: with the cut limit, SLURM's signal, checked every 30 s,
    # may stop a start again before its Ray is up (a job's own --time is hours on a real one).
    slurm.command("scontrol", "update", f"JobId={long_id}", "TimeLimit=10")
    slurm.wait_gone(long_id)
    _assert_study_whole(_trials(long, "long"), 5, _settled(first))
    out = (long / "results" / "slurm" / f"search-long-{long_id}.out").read_text()
    assert "search slurm: the time limit is near" in out
    assert "search slurm: requeued" in out
    # Every start in the one file of the job id: each but the last requeued the job. On a slow
    # hour a second start may meet the cut limit too before the test raised it.
    starts = out.count("trials this run")
    assert starts >= 2 and starts == out.count("search slurm: requeued") + 1, out


def test_scancel_mid_study_and_the_saved_script_continues_it(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """``scancel`` signals every process of the job, Ray's too; ``sbatch`` of the script that
    ``search slurm`` saved continues the study, the trials finished before the cancel kept."""
    work = _study_folder(tmp_path, "cancelled", trials=5, hold_from=2)
    job_id = _submit(slurm, work)

    def two_done_one_waiting() -> bool:
        trials = _trials(work, "cancelled")
        return len(_settled(trials)) >= 2 and any(t.state.name == "RUNNING" for t in trials)

    _wait(slurm, job_id, two_done_one_waiting, "two trials finished and one ran")
    kept = _settled(_trials(work, "cancelled"))
    slurm.command("scancel", job_id)
    slurm.wait_gone(job_id)
    (work / "gate").touch()
    script = work / "results" / "slurm" / "search-cancelled.sbatch"
    again = slurm.command("sbatch", "--parsable", str(script)).strip()
    slurm.wait_gone(again)
    _assert_study_whole(_trials(work, "cancelled"), 5, kept)
    for job in (job_id, again):
        assert (work / "results" / "slurm" / f"search-cancelled-{job}.out").is_file()


def test_the_gpus_slurm_gives_the_job_are_the_ones_its_trials_get(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Ray's GPUs are the job's: as many as ``SLURM_GPUS_ON_NODE``, with the ids of
    ``CUDA_VISIBLE_DEVICES`` (set here as SLURM sets them for a job given GPUs 5 and 7 of a
    node; Ray's GPUs are logical on this CPU machine)."""
    work = _study_folder(tmp_path, "gpus", trials=4, hold_from=99, epochs=2)
    data = yaml.safe_load((work / "s.yaml").read_text())
    write_spec(work / "s.yaml", {**data, "resources": {"gpus_per_trial": 1}})
    submitted = subprocess.run(
        [sys.executable, "-m", "search", "slurm", "s.yaml", "--cpus-per-node", "2"],
        cwd=work, capture_output=True, text=True, timeout=120,
        env=slurm.env(CUDA_VISIBLE_DEVICES="5,7", SLURM_GPUS_ON_NODE="2"),
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    slurm.wait_gone(submitted.stdout.split()[2])
    trials = _trials(work, "gpus")
    assert len(_settled(trials)) == 4, trials
    # each trial on one of the job's GPUs (which ones, and whether both, is Ray's choice)
    assert {t.user_attrs["device"] for t in trials} <= {"cuda (5)", "cuda (7)"}
