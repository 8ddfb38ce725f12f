"""A fused study through ``python -m search run`` (``resources.fuse: 4``, issue 44): every
member is a trial of its own in the record, trained together with others, and its first
epoch is what its trial trains alone (the same config and seed, unfused, in float32: the
first epoch agrees to 1e-3, ``tests/test_fused.py`` says why not more)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from search.compute.data import load_data  # noqa: E402
from search.contract import TrialContext  # noqa: E402
from search.record.queries import read_epochs  # noqa: E402
from search.specs.schema import parse_spec  # noqa: E402
from tests.helpers import REPO, base_spec, cli, fused_spec, stored_study, write_spec  # noqa: E402
from trainables.knobs import read_config  # noqa: E402
from trainables.torch import cnn  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _spec(tmp_path: Path, **resources: Any) -> dict[str, Any]:
    return fused_spec(tmp_path, resources)


def test_a_fused_study_records_every_member_as_its_own_trial(tmp_path: Path) -> None:
    raw = _spec(tmp_path, fuse=4)
    path = write_spec(tmp_path / "fused.yaml", raw)
    proc = cli("run", str(path), "--results", str(tmp_path / "r"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resources.fuse: 4 trials per array" in proc.stderr
    study = stored_study(raw["storage"], "fused")
    trials = study.trials
    assert len(trials) == 8
    assert {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}
    for t in trials:  # one intermediate value per epoch it trained, from 1 on
        assert sorted(t.intermediate_values) == list(range(1, len(t.intermediate_values) + 1))
        assert t.state.name != "COMPLETE" or len(t.intermediate_values) == 2
    epochs = read_epochs(tmp_path / "r" / "fused" / "epochs.csv")
    together = [n for t in epochs.values() for n in t["array_members"].values()]
    assert max(together) >= 2, "no epoch trained two members together"

    spec, data = parse_spec(raw), load_data(parse_spec(raw).data)
    for t in trials[:2]:  # the first epoch, unfused, with the trial's config and seed
        cfg = read_config({**spec.fixed, **t.params}, cnn.DEFAULTS)
        ctx = TrialContext(max_epochs=1, seed=spec.sampler.seed + t.number, num_threads=1)
        (alone,) = list(cnn.train(cfg, data, ctx))
        assert t.intermediate_values[1] == pytest.approx(alone["val_accuracy"], abs=3e-3)
        assert epochs[t.number]["val_loss"][1] == pytest.approx(alone["val_loss"], rel=1e-3)


def test_a_trainable_that_does_not_fuse_is_refused_in_one_line(tmp_path: Path) -> None:
    raw = base_spec(tmp_path, resources={"fuse": 4})
    proc = cli("run", str(write_spec(tmp_path / "s.yaml", raw)))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "resources.fuse: trainable 'search.testing:curve' does not fuse" in proc.stderr
    assert not (tmp_path / "optuna.db").exists()


@pytest.mark.parametrize("value", [1, 2.5, "yes", 1000])
def test_fuse_takes_auto_off_or_a_number_of_trials(tmp_path: Path, value: Any) -> None:
    proc = cli("run", str(write_spec(tmp_path / "s.yaml", _spec(tmp_path, fuse=value))))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "resources.fuse" in proc.stderr and "expected auto, off or a whole number" in proc.stderr


def test_a_users_own_sequential_model_runs_fused(tmp_path: Path) -> None:
    """``examples/torch_fused``: a user's ``nn.Sequential`` through ``search.pytorch``, fused."""
    storage = f"sqlite:///{tmp_path}/o.db"
    args = ["run", "examples/torch_fused/space.yaml", "--trials", "6", "--max-epochs", "2"]
    proc = cli(*args, "--storage", storage, "--results", str(tmp_path / "r"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = stored_study(storage, "digits-fused-mlp")
    assert len(study.trials) == 6
    assert {t.state.name for t in study.trials} <= {"COMPLETE", "PRUNED"}
    epochs = read_epochs(tmp_path / "r" / "digits-fused-mlp" / "epochs.csv")
    assert max(n for t in epochs.values() for n in t["array_members"].values()) >= 2


def test_on_two_gpus_each_gpu_has_a_host_and_each_member_records_its_gpu(tmp_path: Path) -> None:
    """Ray's logical GPUs (``SEARCH_NUM_GPUS``, as the placement tests run): one host per
    GPU; each member's process holds a sliver of one GPU and joins that GPU's host, so the
    trial's ``device`` is the GPU it trained on."""
    import os

    raw = _spec(tmp_path, fuse=4, gpus_per_trial=0.5)
    path = write_spec(tmp_path / "fused.yaml", raw)
    env = {**os.environ, "PYTHONPATH": str(REPO), "SEARCH_NUM_GPUS": "2", "SEARCH_NUM_CPUS": "4"}
    proc = cli("run", str(path), "--results", str(tmp_path / "r"), timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resources.fuse: 4 trials per array, 2 host(s)" in proc.stderr
    study = stored_study(raw["storage"], "fused")
    devices = {t.user_attrs["device"] for t in study.trials}
    assert devices == {"cuda (0)", "cuda (1)"}, devices
