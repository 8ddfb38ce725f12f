"""Data-parallel trials: several devices train one trial; the study sees one.

``resources.workers_per_trial: 2`` on a CPU machine forces two gloo workers per PyTorch trial,
the way ``gpus_per_trial: 2`` gives two NCCL workers on GPUs (:mod:`search.compute.distributed`),
and a TensorFlow trial's ``MirroredStrategy`` over two logical CPU devices, the way it mirrors over
two GPUs (:mod:`trainables.tf.devices`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest

from search.compute.distributed import data_parallel
from search.contract import TrialContext, trainable
from search.contract.dataset import Dataset, load_digits
from search.specs.schema import parse_spec
from search.tuning.runner import RunOptions, run_study
from tests.helpers import alive, base_spec

pytestmark = [pytest.mark.slow, pytest.mark.torch]


@trainable(data_parallel=True)
def probe(config: Mapping[str, Any], data: Dataset, ctx: TrialContext) -> Iterator[dict]:
    """Reports what rank 0 learns from the process group: world size, every rank's pid."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world} says hello", flush=True)
    pids = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(pids, torch.tensor([float(os.getpid())], dtype=torch.float64))
    for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
        if config.get("raise_on_rank") == rank and epoch == 2:
            raise ValueError(f"rank {rank} failed at epoch {epoch}")
        dist.barrier()
        yield {
            "val_accuracy": 0.5,
            "world": float(world),
            "rank": float(rank),
            "ctx_world": float(ctx.world_size),
            **{f"pid{r}": float(p.item()) for r, p in enumerate(pids)},
        }


def test_two_gloo_workers_report_through_rank_zero_write_beside_the_log_and_die_with_the_trial(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    """One pair of gloo workers (their start is the cost) proves three things: rank 0 reports
    what the group saw, rank 1's output goes to its own file beside the trial's log, and
    closing the trial's generator ends both processes."""
    ctx = TrialContext(max_epochs=3, num_threads=1)
    log = tmp_path / "output.log"  # what the worker captures this process's fds into
    epochs = data_parallel("tests.test_ddp:probe", {}, load_digits(0.2, 0), ctx, 2, log=log)
    first = next(epochs)
    assert (first["world"], first["rank"], first["ctx_world"]) == (2.0, 0.0, 2.0)
    pids = [int(first["pid0"]), int(first["pid1"])]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert all(alive(pid) for pid in pids)
    epochs.close()  # what ASHA's stop does to the trial's generator
    assert not any(alive(pid) for pid in pids)
    assert (tmp_path / "output.rank1.log").read_text() == "rank 1 of 2 says hello\n"
    assert "rank 0 of 2 says hello\n" in capfd.readouterr().out  # rank 0: the actor's own
    assert sorted(p.name for p in tmp_path.iterdir()) == ["output.rank1.log"]


def test_an_error_on_any_rank_ends_the_trial_with_that_error() -> None:
    ctx = TrialContext(max_epochs=3, num_threads=1)
    epochs = data_parallel(
        "tests.test_ddp:probe", {"raise_on_rank": 1}, load_digits(0.2, 0), ctx, workers=2
    )
    with pytest.raises(ValueError, match="rank 1 failed at epoch 2"):
        list(epochs)


def test_the_failing_ranks_own_error_wins_over_its_peers_connection_error() -> None:
    """Which rank's message arrives first is a race: rank 0's gloo ``Connection reset by
    peer`` (its peer stopped) must not hide rank 1's own error arriving just after it."""
    from multiprocessing import Pipe

    from search.compute.distributed import _own_error

    peer = RuntimeError("[gloo/transport/tcp/pair.cc:545] Read error: Connection reset by peer")
    ours, theirs = Pipe()
    theirs.send(("error", ValueError("rank 1 failed at epoch 2")))
    assert str(_own_error(peer, [ours], grace_s=5)) == "rank 1 failed at epoch 2"
    assert _own_error(peer, [Pipe()[0]], grace_s=0.2) is peer  # no other error came
    own = ValueError("rank 0 failed")
    assert _own_error(own, [ours], grace_s=5) is own


def _one_trial_on_two_devices(tmp_path: Path, trainable: str, epochs: int) -> Any:
    """Runs a one-trial study of ``trainable`` with ``workers_per_trial: 2`` on CPU; its trial."""
    spec = parse_spec(
        base_spec(
            tmp_path,
            study=trainable,
            trainable=trainable,
            budget={"trials": 1, "max_epochs": epochs},
            asha={"enabled": False},
            resources={"workers_per_trial": 2, "cpus_per_trial": 2},
            fixed={"channels": 8, "optimizer": "adam", "batch_size": 64},
            space={"lr": {"loguniform": [3.0e-3, 4.0e-3]}},
        )
    )
    run_study(spec, RunOptions(results_dir=tmp_path / "results", progress=False))
    study = optuna.load_study(study_name=trainable, storage=spec.storage)
    assert len(study.trials) == 1
    trial = study.trials[0]
    assert trial.state.name == "COMPLETE", trial.user_attrs.get("fail_reason")
    assert sorted(trial.intermediate_values) == list(range(1, epochs + 1))
    return trial


def test_a_cnn_trial_trains_on_two_gloo_workers_and_the_study_records_one_trial(
    ray_local: None, tmp_path: Path
) -> None:
    trial = _one_trial_on_two_devices(tmp_path, "torch_cnn", epochs=3)
    assert trial.user_attrs["device"] == "cpu" and trial.user_attrs["epochs"] == 3
    assert trial.user_attrs["replicas"] == 2
    assert trial.value is not None and trial.value > 0.8  # both shards trained one model


@pytest.mark.tf
def test_a_tf_cnn_trial_mirrors_over_two_logical_cpus_and_the_study_records_one_trial(
    ray_local: None, tmp_path: Path
) -> None:
    # TF's data-parallel path is one process (MirroredStrategy); without GPUs the trial's CPU
    # is split into as many logical devices as workers_per_trial asks
    trial = _one_trial_on_two_devices(tmp_path, "tf_cnn", epochs=2)
    assert trial.user_attrs["replicas"] == 2  # what the strategy reported, not what was asked
    assert trial.user_attrs["device"] == "cpu"
    assert trial.value is not None and trial.value > 0.8  # both replicas trained one model
