"""``benchmarks/gpu_check.py --dry-run``: the device check's code on this CPU at a tiny size.

One run (its own Ray of 2 CPUs and one logical GPU, which every contender joins) goes through
the solo ceiling, ``auto``'s throughput probe (1 and 2 trials at once on the GPU), the
studies at ``auto``, a fixed packing and full length, stock Ray Tune at a fractional
``gpus_per_trial``, the meter (no NVML here: it says so) and trial 0's profile, attached for
the dashboard. What a GPU run would print, checked before a device is spent on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def test_the_dry_run_measures_every_contender_and_attaches_the_profile(tmp_path: Path) -> None:
    out = tmp_path / "check"
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--out", str(out)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())["resnet"]
    assert report["solo"]["ceiling_images_per_s"] > 0
    assert set(report["solo"]["rates"]) == {"64/fp32", "64/bf16"}
    assert sorted(report["probe"]) == ["1", "2"] and min(report["probe"].values()) > 0
    rows = {r["name"]: r for r in report["studies"]}
    assert set(rows) == {"auto", "fixed-1", "auto-full", "stock Ray Tune at 0.5"}
    for row in rows.values():
        assert row["epochs"] > 0 and row["images_per_s"] > 0, row
        assert row["meter"]["source"] != "NVML"  # no GPU here: the meter says why
    assert rows["auto"]["decision"].startswith("gpus_per_trial auto: not measured")
    assert rows["fixed-1"]["gpus_per_trial"] == 1.0
    profile = out / "profile-trial0.json"
    assert json.loads(profile.read_text())["traceEvents"]
    import optuna

    from search.record.artifacts import attached

    study = optuna.load_study(study_name="gpu-check-auto", storage=f"sqlite:///{out}/optuna.db")
    trial0 = next(t for t in study.trials if t.number == 0)
    assert "profile-trial0.json" in attached(study)[trial0._trial_id]  # as the dashboard lists


def test_the_fused_dry_run_measures_arrays_against_one_trial_after_another(
    tmp_path: Path,
) -> None:
    out = tmp_path / "fused"
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--only", "fused", "--dry-run", "--out",
         str(out)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())["fused"]
    assert [r["members"] for r in report["rates"]] == [1, 2]
    assert all(r["fused_images_per_s"] > 0 for r in report["rates"])
    assert report["meter"]["source"]  # no NVML on this CPU: the meter says why
    auto, packed = report["studies"]
    assert [s["trials"] for s in report["studies"]] == [4, 4]
    assert any(line.startswith("fuse auto: ") for line in auto["decisions"]), auto
    assert "images/s of one array by members" in " ".join(auto["decisions"])  # it measured
    assert any(line.startswith("gpus_per_trial auto: ") for line in packed["decisions"])
    assert not any(line.startswith("fuse auto:") for line in packed["decisions"])  # fuse: off
    assert packed["contender"] == "fuse off, gpus_per_trial auto" and packed["epochs_per_s"] > 0
