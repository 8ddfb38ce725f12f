"""``resources.fuse: auto``, the default (``search/tuning/fusion_auto.py``, issue 44): what it
decides without measuring (a trainable that does not fuse, a space whose knobs split an
array, CPUs), what its arithmetic makes of measured rates, and a run on one logical GPU whose
record is what its printed decision says."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from search.compute.placement import Placement
from search.specs.schema import parse_spec
from search.tuning import fusion_auto
from search.tuning.fusion_auto import MARGIN, FuseDecision, choice, decide_fuse
from tests.helpers import REPO, base_spec, cli, fused_spec, stored_study, write_spec

CPUS = Placement(cpus_per_trial=1.0, gpus_per_trial=0.0, concurrency=2, num_threads=1)
HALF_GPU = Placement(cpus_per_trial=1.0, gpus_per_trial=0.5, concurrency=2, num_threads=1)


def _spec(tmp_path: Path, space: dict[str, Any] | None = None, **resources: Any) -> dict[str, Any]:
    spec = fused_spec(tmp_path, resources, study="auto", budget={"trials": 4, "max_epochs": 2})
    return {**spec, "space": space} if space else spec


def test_auto_is_the_default_and_off_null_and_numbers_are_read_as_written(tmp_path: Path) -> None:
    def fuse(value: Any = "unset") -> Any:
        resources = {} if value == "unset" else {"fuse": value}
        return parse_spec(_spec(tmp_path, **resources)).resources.fuse

    assert fuse() == "auto" and fuse("auto") == "auto"
    assert fuse("off") is None and fuse(False) is None and fuse(None) is None  # YAML's off: False
    assert fuse(8) == 8


def test_what_auto_decides_without_measuring(tmp_path: Path) -> None:
    def decided(raw: dict[str, Any], placement: Placement = HALF_GPU) -> FuseDecision:
        return decide_fuse(parse_spec(raw), placement, data=None)  # type: ignore[arg-type]

    assert decided(base_spec(tmp_path)) == FuseDecision(None)  # curve does not fuse: silent
    assert decided(_spec(tmp_path, fuse="off")) == FuseDecision(None)
    assert decided(_spec(tmp_path, fuse=4)) == FuseDecision(4)
    varied = _spec(tmp_path, {"lr": {"uniform": [0.001, 0.1]},
                              "batch_size": {"int": [32, 64]},
                              "optimizer": {"choice": ["sgd", "adam"]}})  # fmt: skip
    # the optimizer is a member's own (trainables/torch/fused.py); a batch size drawn from a
    # range splits (a choice of sizes with a common divisor shares an array)
    split = decided({**varied, "fixed": {"channels": 4}})
    assert split.members is None
    assert split.line.startswith("fuse auto: off: the space varies batch_size, each")
    on_cpus = decided(_spec(tmp_path), CPUS)
    assert on_cpus.members is None and on_cpus.line.startswith("fuse auto: off on CPUs")
    fp16 = decided({**_spec(tmp_path), "fixed": {"channels": 4, "precision": "fp16"}})
    assert fp16.members is None and "fp16" in fp16.line


def test_on_a_gpu_auto_fuses_the_fewest_members_near_the_best_when_they_beat_the_unfused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision from measured figures (the measurement itself runs in the last test)."""
    spec = parse_spec(_spec(tmp_path))
    measured = {1: 2_000.0, 2: 3_900.0, 4: 7_400.0, 8: 7_600.0}
    monkeypatch.setattr(fusion_auto, "array_rates", lambda *a: measured)
    monkeypatch.setattr(fusion_auto, "packed_rate", lambda *a: 2_400.0)
    fused = decide_fuse(spec, HALF_GPU, data=None)  # type: ignore[arg-type]
    assert fused.members == 4, fused  # 8 adds under 5 %: the fewer members train as fast
    assert "4 trials an array" in fused.line and "unfused trials on it 2,400" in fused.line
    monkeypatch.setattr(fusion_auto, "packed_rate", lambda *a: 7_400.0 / (1 + MARGIN) * 1.01)
    assert decide_fuse(spec, HALF_GPU, data=None).members is None  # type: ignore[arg-type]
    packed = Placement(1.0, 0.25, 4, 1, rates=((1, 2_000.0), (4, 9_000.0)))  # auto measured it
    assert decide_fuse(spec, packed, data=None).members is None  # type: ignore[arg-type]


def test_choice_needs_two_members_and_a_measured_baseline() -> None:
    assert choice({1: 9_000.0, 2: 9_100.0}, unfused=1_000.0)[0] is None  # one member is best
    assert choice({}, unfused=1_000.0)[0] is None
    assert choice({1: 1_000.0, 2: 5_000.0}, unfused=0.0)[0] is None


@pytest.mark.slow
@pytest.mark.torch
def test_on_a_logical_gpu_auto_measures_and_the_record_is_what_it_printed(tmp_path: Path) -> None:
    """Ray's logical GPU (the trials train on the CPU): ``auto`` measures the array and the
    packed trials, prints its figures, and the trials ran fused exactly when it said so."""
    pytest.importorskip("torch")
    from search.record.queries import read_epochs

    raw = _spec(tmp_path, gpus_per_trial=0.5)
    path = write_spec(tmp_path / "auto.yaml", raw)
    env = {**os.environ, "PYTHONPATH": str(REPO), "SEARCH_NUM_GPUS": "1", "SEARCH_NUM_CPUS": "4"}
    proc = cli("run", str(path), "--results", str(tmp_path / "r"), timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("fuse auto:")]
    assert "images/s of one array by members on one GPU: 1: " in line, line
    assert "unfused trials on it" in line, line
    study = stored_study(raw["storage"], "auto")
    assert len(study.trials) == 4
    assert {t.state.name for t in study.trials} <= {"COMPLETE", "PRUNED"}
    epochs = read_epochs(tmp_path / "r" / "auto" / "epochs.csv")
    fused = any("array_members" in curves for curves in epochs.values())
    assert fused == ("trials an array" in line), line
