"""search.lightning.fit on several devices: Lightning's DDP over the trial's own processes.

Two trials of two gloo processes each on CPU (``workers_per_trial: 2``), started by
search.compute.distributed as for the PyTorch built-ins; Lightning gets the group they joined
and starts none of its own. Only the training processes import Lightning and torch (this
module does not: the driver and the Ray actor import it too, and on a busy 2-core machine
each import of Lightning costs seconds).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import search.lightning
from search.contract import TrialContext, trainable
from search.record.queries import EPOCHS_FILE, read_epochs
from search.record.study import load_study
from search.specs.schema import parse_spec
from search.tuning.runner import RunOptions, run_study
from tests.helpers import alive

pytestmark = [
    pytest.mark.slow,
    pytest.mark.torch,
    pytest.mark.ray,
    pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="no Lightning"),
]
SAMPLES = 64
"""The training set: 32 samples per rank when two share it."""


def _probe_module(trial_number: int) -> Any:
    """A linear fit that logs what the process group saw: its size, every rank's pid, the
    mean rank and the samples trained (both synced), and ``val_score`` (1 for trial 0, 0 for
    the others: trial 1 falls below ASHA's first cutoff)."""
    import lightning
    import torch
    from torch import nn

    class Probe(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(1, 1)
            self.seen = 0

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            self.seen += len(x)
            return nn.functional.mse_loss(self.layer(x), y)

        def on_train_epoch_start(self) -> None:
            self.seen = 0

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self.layer(x), y), sync_dist=True)

        def on_validation_epoch_end(self) -> None:
            pids = self.all_gather(torch.tensor(float(os.getpid()), dtype=torch.float64))
            for rank, pid in enumerate(pids.reshape(-1).tolist()):
                self.log(f"pid{rank}", pid)
            self.log("world", float(self.trainer.world_size))
            self.log("rank_mean", float(self.global_rank), sync_dist=True)
            self.log("samples", float(self.seen), sync_dist=True, reduce_fx="sum")
            self.log("val_score", 1.0 - min(trial_number, 1) + 0.01 * self.current_epoch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Probe()


@trainable(data_parallel=True)
def probe(config: Mapping[str, Any], data: Any, ctx: TrialContext) -> Generator[dict, None, Any]:
    """Fits the probe module; every rank prints each epoch's metrics as it got them."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(ctx.seed)
    x = torch.linspace(-1, 1, SAMPLES).reshape(-1, 1)
    loader = DataLoader(TensorDataset(x, 2 * x), batch_size=8)
    module = _probe_module(ctx.trial_number)
    epochs = search.lightning.fit(module, ctx, train_dataloaders=loader, val_dataloaders=loader)
    return (yield from _printed(epochs, ctx))


def _printed(epochs: Iterator[dict], ctx: TrialContext) -> Generator[dict, None, Any]:
    for metrics in epochs:
        print(f"rank {ctx.rank} metrics {json.dumps(metrics, sort_keys=True)}", flush=True)
        yield metrics


def _rank_lines(path: Path, rank: int) -> list[dict[str, float]]:
    found = re.findall(rf"^rank {rank} metrics (.*)$", path.read_text(), re.MULTILINE)
    return [json.loads(line) for line in found]


@pytest.fixture(scope="module")
def ran(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """Two trials of two processes each, one after the other: #0 runs 3 epochs, #1 is
    pruned at ASHA's first rung."""
    tmp = tmp_path_factory.mktemp("lddp")
    spec = parse_spec(
        {  # tests.conftest.base_spec, written out: importing conftest here imports torch
            "study": "lddp",
            "trainable": "tests.test_lightning_ddp:probe",
            "objective": {"metric": "val_score", "mode": "max"},
            "budget": {"trials": 2, "max_epochs": 3},
            "asha": {"grace_period": 1, "reduction_factor": 2},
            "sampler": {"name": "random", "seed": 0},
            "storage": f"sqlite:///{tmp}/optuna.db",
            "resources": {"workers_per_trial": 2, "cpus_per_trial": 2},
            "space": {"x": {"uniform": [0.0, 1.0]}},
        }
    )
    run_study(spec, RunOptions(results_dir=tmp / "results", progress=False))
    return load_study("lddp", spec.storage), tmp / "results"


def test_a_ddp_trial_completes_with_rank_zero_metrics_and_another_is_pruned(ran: Any) -> None:
    study, results = ran
    first, second = study.trials
    assert first.state.name == "COMPLETE", first.user_attrs.get("fail_reason")
    assert second.state.name == "PRUNED", second.user_attrs.get("fail_reason")
    assert sorted(first.intermediate_values) == [1, 2, 3]
    assert sorted(second.intermediate_values) == [1]
    assert first.user_attrs["replicas"] == 2
    curves = read_epochs(results / "lddp" / EPOCHS_FILE)
    assert curves[0]["world"] == {1: 2.0, 2: 2.0, 3: 2.0}
    assert curves[0]["rank_mean"] == {1: 0.5, 2: 0.5, 3: 0.5}  # both ranks in every mean
    assert curves[0]["samples"] == {1: SAMPLES, 2: SAMPLES, 3: SAMPLES}  # 32 on each
    assert curves[0]["pid0"][1] != curves[0]["pid1"][1]


def test_each_rank_saw_the_same_synced_metrics_and_wrote_its_own_log(ran: Any) -> None:
    study, _ = ran
    log = Path(study.trials[0].user_attrs["log"])
    zero, one = _rank_lines(log, 0), _rank_lines(log.with_name("output.rank1.log"), 1)
    assert len(zero) == len(one) == 3
    assert _rank_lines(log, 1) == []  # rank 1 writes only to its own file
    for mine, theirs in zip(zero, one, strict=True):
        assert mine == theirs  # synced, or the same on every rank (world, the pids)


def test_the_pruned_trial_stopped_on_every_rank(ran: Any) -> None:
    study, _ = ran
    log = Path(study.trials[1].user_attrs["log"])
    zero, one = _rank_lines(log, 0), _rank_lines(log.with_name("output.rank1.log"), 1)
    assert len(zero) == len(one) == 1  # rank 1 waited in epoch 2's first all-reduce
    pids = [int(zero[0]["pid0"]), int(zero[0]["pid1"])]
    assert len(set(pids)) == 2
    # Tune ends a stopped trial's thread at its next report, or ends its actor; either way
    # both processes go (the socket to the actor closes, then gloo's connection to rank 0)
    for _ in range(600):
        if not any(alive(pid) for pid in pids):
            break
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids), "a rank of the pruned trial outlived it"
