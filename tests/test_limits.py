"""What a trial's process gets before the trainable runs (:mod:`search.compute.limits`).

No GPU is needed: TensorFlow's device calls are replaced by recorders, so the test sees the
memory limit the framework asked TensorFlow for.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from search.compute.limits import ALLOC_CONF, apply_limits
from search.contract import TrialContext

GIB = 2**30


@pytest.fixture
def tf_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """TensorFlow with one fake GPU; its configuration calls recorded, not applied."""
    tf = pytest.importorskip("tensorflow")
    calls: dict[str, list[Any]] = {"logical": [], "growth": [], "threads": []}
    gpu = object()
    monkeypatch.setattr(
        tf.config, "list_physical_devices", lambda kind=None: [gpu] if kind == "GPU" else []
    )
    monkeypatch.setattr(
        tf.config,
        "set_logical_device_configuration",
        lambda device, configs: calls["logical"].append((device, configs)),
    )
    monkeypatch.setattr(
        tf.config.experimental,
        "set_memory_growth",
        lambda device, on: calls["growth"].append((device, on)),
    )
    for name in ("set_intra_op_parallelism_threads", "set_inter_op_parallelism_threads"):
        monkeypatch.setattr(tf.config.threading, name, calls["threads"].append)
    if (torch := sys.modules.get("torch")) is not None:
        monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", ALLOC_CONF):
        monkeypatch.setenv(var, os.environ.get(var, ""))  # restored after the test
    calls["gpu"] = [gpu]
    return calls


@pytest.mark.tf
def test_a_packed_tf_trial_gets_its_share_of_the_gpus_memory(
    tf_calls: dict[str, list[Any]],
) -> None:
    ctx = TrialContext(
        max_epochs=1,
        num_threads=2,
        device="cuda",
        gpu_memory_fraction=0.25,
        gpu_total_bytes=8 * GIB,
    )
    applied = apply_limits(ctx)
    [(device, [config])] = tf_calls["logical"]
    assert device is tf_calls["gpu"][0]
    assert config.memory_limit == int(0.25 * 8 * GIB / 2**20) == 2048  # MiB
    assert applied["tf_memory_limit_mb"] == 2048
    assert tf_calls["growth"] == [] and tf_calls["threads"] == [2, 2]


@pytest.mark.tf
def test_a_tf_trial_with_the_whole_gpu_grows_its_memory(tf_calls: dict[str, list[Any]]) -> None:
    applied = apply_limits(TrialContext(max_epochs=1, device="cuda", gpu_total_bytes=8 * GIB))
    assert tf_calls["logical"] == [] and tf_calls["growth"] == [(tf_calls["gpu"][0], True)]
    assert "tf_memory_limit_mb" not in applied
