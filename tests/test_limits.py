"""What a trial's process gets before the trainable runs (:mod:`search.compute.limits`).

No GPU is needed: TensorFlow's device calls are replaced by recorders, so the test sees the
memory limit the framework asked TensorFlow for; ``nvidia-smi`` is a script on ``PATH``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from search.compute.job import trial_context, trial_job
from search.compute.limits import ALLOC_CONF, apply_limits
from search.compute.placement import Measurement, Share, resolve
from search.contract import TrialContext
from search.specs.schema import ResourcesSpec, parse_spec
from tests.helpers import REPO, base_spec

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


@pytest.mark.tf
def test_the_share_travels_typed_from_the_placement_to_tensorflows_cap(
    tf_calls: dict[str, list[Any]], tmp_path: Path
) -> None:
    measured = Measurement(peak_bytes=6 * GIB, total_bytes=80 * GIB)
    resources = ResourcesSpec(gpus_per_trial="auto")
    placement = resolve(resources, {"CPU": 32.0, "GPU": 2.0}, measured)
    job = trial_job(parse_spec(base_spec(tmp_path)), None, placement)
    assert job.share == Share(placement.gpus_per_trial, placement.memory_fraction, 80 * GIB)
    ctx = trial_context(job, seed=0, device="cuda")
    applied = apply_limits(ctx)
    share = placement.memory_fraction
    assert share is not None and ctx.gpu_memory_fraction == share
    [(_, [config])] = tf_calls["logical"]
    assert config.memory_limit == applied["tf_memory_limit_mb"] == int(share * 80 * 1024)
    # a retry that holds twice the GPU gets twice the cap
    retried = trial_context(job, seed=0, device="cuda", share=job.share.holding(0.2))
    apply_limits(retried)
    assert tf_calls["logical"][-1][1][0].memory_limit == int(2 * share * 80 * 1024)


@pytest.mark.tf
def test_a_fixed_share_reads_the_visible_gpus_size_from_nvidia_smi(
    tf_calls: dict[str, list[Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = tmp_path / "asked.txt"
    fake = tmp_path / "bin" / "nvidia-smi"  # a stand-in for the real tool: 16 GiB
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" > {asked}\necho 16384\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")  # as Ray sets it
    job = trial_job(parse_spec(base_spec(tmp_path, resources={"gpus_per_trial": 0.5})), None)
    applied = apply_limits(trial_context(job, seed=0, device="cuda"))
    assert job.share.memory_fraction == 0.45 and job.share.gpu_total_bytes is None
    [(_, [config])] = tf_calls["logical"]
    assert config.memory_limit == applied["tf_memory_limit_mb"] == int(0.45 * 16384)
    assert asked.read_text().split()[0] == "--id=3"


LAZY = """
import json, sys
from search.compute.limits import apply_limits
from search.contract import TrialContext
applied = apply_limits(TrialContext(max_epochs=1, num_threads=1, replicas=2))
assert "tensorflow" not in sys.modules
import tensorflow as tf  # as a trainable that imports it inside its function
pools = tf.config.threading
print(json.dumps([pools.get_intra_op_parallelism_threads(),
                  pools.get_inter_op_parallelism_threads(),
                  len(tf.config.list_logical_devices("CPU")), applied]))
"""


@pytest.mark.tf
def test_tensorflow_imported_after_the_limits_still_gets_them() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", LAZY], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    intra, inter, cpus, applied = json.loads(done.stdout.strip().splitlines()[-1])
    assert (intra, inter, cpus) == (1, 1, 2)
    assert applied == {"threads": 1, "tf_cpu_devices": 2}


ORDERS = """
import json, sys
from search.compute.limits import apply_limits
from search.contract import TrialContext
first = sys.argv[1]  # what the process imported before the TF trainable's import
if first == "torch":
    import torch
ctx = TrialContext(max_epochs=1, num_threads=1, seed=3)
apply_limits(ctx)
if first == "tensorflow":  # TensorFlow first, then Keras through tf.keras
    import tensorflow as tf
    tf.keras.layers.Dense

def draws():  # a trainable that imports Keras inside its function
    import keras, tensorflow as tf
    layer = keras.layers.Dense(2)
    layer.build((None, 3))
    return [float(layer.kernel.numpy().flat[0]), float(tf.random.uniform(()))]

fresh = draws()
apply_limits(ctx)  # the next trial, in the same (reused) process
import tensorflow as tf
print(json.dumps([fresh, draws(), tf.config.threading.get_intra_op_parallelism_threads()]))
"""


@pytest.mark.tf
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="no tensorflow")
def test_keras_and_tensorflow_get_their_limits_and_seed_whatever_came_first() -> None:
    """``import keras`` imports TensorFlow: the limits applied the moment TensorFlow's import
    ends must not touch the half-imported Keras (nor ``tf.keras``, which then breaks for the
    rest of the process); Keras gets the seed when its own import ends. Fresh or reused,
    whatever was imported first, the process draws the same numbers."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = {
        first: subprocess.Popen(
            [sys.executable, "-c", ORDERS, first],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        for first in ("keras", "tensorflow", "torch")
    }
    seen = []
    for first, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (first, err[-2000:])
        assert "could not apply" not in err, (first, err[-2000:])
        fresh, reused, threads = json.loads(out.strip().splitlines()[-1])
        assert threads == 1
        seen += [fresh, reused]
    assert all(draws == seen[0] for draws in seen), seen


def test_the_limits_seed_the_process_generators_from_the_trials_seed() -> None:
    """A trainable that seeds nothing (a LightningModule built before ``fit``) draws the same
    numbers in its trial, its confirmation run, the exported model and ``train``."""
    import random

    import numpy as np
    import torch

    from search.compute.limits import apply_limits, disarm
    from search.contract import TrialContext

    def draws(seed: int) -> tuple[float, float, float]:
        apply_limits(TrialContext(max_epochs=1, seed=seed, num_threads=torch.get_num_threads()))
        disarm()
        return random.random(), float(np.random.random()), float(torch.rand(1))

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
