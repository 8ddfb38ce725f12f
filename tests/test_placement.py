"""Placement: the packing arithmetic, ``auto`` on CPUs, and trials on logical GPUs.

The arithmetic is pure (``search.compute.placement``). The Ray tests run the synthetic
``search.testing:curve`` trainable with its tracing knobs (``trace_dir``, ``wait_for``,
``oom_below_share``): every trial writes where and when it ran. The logical-GPU tests share
one subprocess with its own Ray of 4 GPUs the machine does not have (the session's shared Ray
has none): Ray hands out GPU ids and sets ``CUDA_VISIBLE_DEVICES`` all the same.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from search.compute.gpu_memory import Measurement, largest_config
from search.compute.job import TrialJob
from search.compute.placement import (
    CUDA_CONTEXT_BYTES,
    IN_PROCESS,
    Packing,
    PlacementError,
    Share,
    grow_share,
    memory_fraction,
    pack,
    resolve,
)
from search.errors import SearchError
from search.record.study import confirm_storage
from search.specs.schema import ResourcesSpec, parse_spec
from search.specs.space import Param
from search.tuning.oom import out_of_memory
from search.tuning.runner import RunOptions, run_study
from tests.helpers import REPO, base_spec

GIB = 2**30


def res(**kwargs: object) -> ResourcesSpec:
    return ResourcesSpec.model_validate(kwargs)


# ---- pure arithmetic ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("peak_gib", "total_gib", "headroom", "expected"),
    [
        (2, 80, 0.25, 16),  # 26 fit, capped at 16
        (20, 80, 0.25, 3),  # 80 // (25 + 0.5)
        (10, 80, 0.0, 7),  # 80 // 10.5
        (30, 80, 0.5, 1),  # 45.5 fits once: the whole GPU
        (90, 80, 0.25, 1),  # does not fit at all: still one trial (it may OOM, and retry)
    ],
)
def test_pack_fits_peak_headroom_and_context_into_each_share(
    peak_gib: float, total_gib: float, headroom: float, expected: int
) -> None:
    peak, total = int(peak_gib * GIB), int(total_gib * GIB)
    packing = pack(peak, total, headroom)
    assert packing.trials_per_gpu == expected
    if expected == 1:
        assert packing == Packing(1, 1.0, None)
        return
    assert packing.gpu_share == math.floor(10_000 / expected) / 10_000
    assert packing.trials_per_gpu * packing.gpu_share <= 1.0
    cap = packing.memory_fraction
    assert cap is not None
    # each trial's allocator cap holds its peak and headroom; cap + context stays in its share
    assert cap * total >= peak * (1 + headroom) * 0.999
    assert cap * total + CUDA_CONTEXT_BYTES <= packing.gpu_share * total + 1


def test_pack_respects_max_per_gpu_and_rejects_nonsense() -> None:
    assert pack(1 * GIB, 80 * GIB, max_per_gpu=4).trials_per_gpu == 4
    assert pack(0, 80 * GIB).trials_per_gpu == 16  # nothing measured on the GPU: context only
    with pytest.raises(ValueError):
        pack(GIB, 0)
    with pytest.raises(ValueError):
        pack(GIB, GIB, headroom=-0.1)


def test_grow_share_doubles_until_a_whole_gpu() -> None:
    assert [grow_share(s) for s in (0.0625, 0.125, 0.25, 0.5, 1.0)] == [0.125, 0.25, 0.5, 1.0, 1.0]
    assert grow_share(0.3333) == 1.0 and grow_share(0.2) == 0.5


def test_memory_fraction_of_a_share() -> None:
    assert memory_fraction(1.0) is None
    assert memory_fraction(0.5) == 0.45  # GPU size unknown: 5 % kept for the CUDA context
    assert memory_fraction(0.25, total_bytes=16 * GIB) == 0.2187  # 0.25 - 0.5/16


def test_a_share_scales_its_cap_with_the_share_a_retry_holds() -> None:
    planned = Share(gpus=0.25, memory_fraction=0.2, gpu_total_bytes=16 * GIB)
    assert planned.holding(0.25).memory_fraction == 0.2
    assert planned.holding(0.5) == Share(0.5, 0.4, 16 * GIB)
    assert planned.holding(1.0).memory_fraction is None
    assert planned.holding(None) == planned
    unplanned = Share().holding(0.5)
    assert unplanned.gpus == 0.5 and unplanned.memory_fraction == 0.45


def test_out_of_memory_recognises_torch_and_tf_errors() -> None:
    assert out_of_memory("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
    assert out_of_memory("ResourceExhaustedError: OOM when allocating tensor")
    assert not out_of_memory("ValueError: synthetic failure at epoch 4")


def test_largest_config_takes_the_upper_end_of_every_size() -> None:
    space = {
        "batch_size": Param(choice=[32, 64, 256, 128]),
        "channels": Param.model_validate({"int": [8, 64]}),
        "lr": Param(loguniform=(1e-4, 1e-1)),
        "precision": Param(choice=["bf16", "fp32"]),
        "optimizer": Param(choice=["sgd", "adamw"]),
        "momentum": Param(uniform=(0.8, 0.99), when={"optimizer": "sgd"}),
        "lr_scheduler": Param(choice=["none", "cosine"]),
    }
    config = largest_config(space, {"num_workers": 0})
    assert config == {
        "num_workers": 0,
        "batch_size": 256,
        "channels": 64,
        "lr": 0.1,
        "precision": "fp32",
        "optimizer": "adamw",
        "lr_scheduler": "none",
    }


# ---- resolve: what each trial gets ----------------------------------------------------------


def test_auto_without_gpus_runs_on_cpus_with_one_thread_per_core_share() -> None:
    placed = resolve(res(gpus_per_trial="auto"), {"CPU": 8.0})
    assert (placed.gpus_per_trial, placed.concurrency, placed.num_threads) == (0.0, 8, 1)
    assert placed.cpus_per_trial == 1.0 and placed.memory_fraction is None
    assert "no GPU" in placed.note


def test_auto_without_gpus_gives_fewer_trials_more_threads() -> None:
    placed = resolve(res(gpus_per_trial="auto", max_concurrent=2), {"CPU": 8.0})
    assert (placed.cpus_per_trial, placed.concurrency, placed.num_threads) == (4.0, 2, 4)
    placed = resolve(res(gpus_per_trial="auto", cpus_per_trial=3), {"CPU": 8.0})
    assert (placed.concurrency, placed.num_threads) == (2, 3)


def test_auto_on_gpus_packs_what_the_measurement_allows() -> None:
    measured = Measurement(peak_bytes=6 * GIB, total_bytes=80 * GIB)
    placed = resolve(res(gpus_per_trial="auto"), {"CPU": 32.0, "GPU": 2.0}, measured)
    # 80 // (7.5 + 0.5) = 10 per GPU, 20 at once; 32 cores -> 1 CPU each
    assert placed.packing is not None and placed.packing.trials_per_gpu == 10
    assert (placed.gpus_per_trial, placed.concurrency, placed.cpus_per_trial) == (0.1, 20, 1.0)
    assert placed.memory_fraction == memory_fraction(0.1, 80 * GIB)
    assert placed.share == Share(0.1, placed.memory_fraction, 80 * GIB)


def test_auto_on_gpus_spreads_cpu_bound_trials_over_every_gpu() -> None:
    measured = Measurement(peak_bytes=GIB // 10, total_bytes=80 * GIB)
    placed = resolve(res(gpus_per_trial="auto"), {"CPU": 16.0, "GPU": 8.0}, measured)
    # 16 cores allow 16 trials: 2 per GPU (not 16 crowding GPU 0), 1 core each
    assert placed.packing is not None and placed.packing.trials_per_gpu == 2
    assert (placed.gpus_per_trial, placed.concurrency) == (0.5, 16)
    unmeasured = resolve(res(gpus_per_trial="auto"), {"CPU": 16.0, "GPU": 2.0}, None)
    assert (unmeasured.gpus_per_trial, unmeasured.concurrency) == (1.0, 2)
    assert unmeasured.memory_fraction is None and unmeasured.cpus_per_trial == 8.0


# ---- auto by throughput: figures of the kind an H100 gives a small convnet ------------------

SATURATES = {1: 21_000.0, 2: 35_500.0, 4: 37_000.0, 8: 36_100.0}
"""Summed images/s: two trials fill the GPU, four add little, eight only time-slice it."""


def test_the_probe_stops_once_doubling_adds_nothing_and_packs_the_fewest_near_the_most() -> None:
    from search.compute.throughput import choose, counts_to_try, next_count

    assert counts_to_try(16) == [1, 2, 4, 8, 16] and counts_to_try(3) == [1, 2, 3]
    measured: dict[int, float] = {}
    while (k := next_count(measured, fit=16)) is not None:
        measured[k] = SATURATES[k]
    assert sorted(measured) == [1, 2, 4]  # 4 gave under 5 % more than 2: 8 and 16 not run
    assert choose(measured) == 2  # 37,000 at 4 is within 5 % of 35,500 at 2
    assert choose({1: 900.0, 2: 1_700.0, 4: 3_300.0, 8: 6_000.0}) == 8  # still climbing
    assert choose({1: 900.0, 2: 0.0}) == 1  # out of memory at 2: no throughput there


def test_auto_on_gpus_packs_by_the_measured_rates_on_every_gpu_within_memory() -> None:
    rates = tuple(SATURATES.items())
    measured = Measurement(peak_bytes=2 * GIB, total_bytes=80 * GIB, rates=rates)
    placed = resolve(res(gpus_per_trial="auto"), {"CPU": 64.0, "GPU": 4.0}, measured)
    assert placed.packing is not None and placed.packing.trials_per_gpu == 2
    assert (placed.gpus_per_trial, placed.concurrency) == (0.5, 8)  # 2 on each of 4 GPUs
    assert placed.memory_fraction == memory_fraction(0.5, 80 * GIB)
    assert "images/s summed" in placed.note and "2: 35,500" in placed.note
    # memory still bounds it: at 30 GiB a trial, two fit, whatever the rates say
    big = Measurement(peak_bytes=30 * GIB, total_bytes=80 * GIB, rates=((1, 9e3), (2, 1.7e4)))
    climbing = resolve(res(gpus_per_trial="auto"), {"CPU": 64.0, "GPU": 1.0}, big)
    assert climbing.packing is not None and climbing.packing.trials_per_gpu == 2
    by_memory = resolve(
        res(gpus_per_trial="auto"), {"CPU": 64.0, "GPU": 4.0}, replace(measured, rates=())
    )
    assert by_memory.packing is not None and by_memory.packing.trials_per_gpu == 16


def test_fractional_gpus_pack_and_cap_memory() -> None:
    placed = resolve(res(gpus_per_trial=0.5, cpus_per_trial=1), {"CPU": 8.0, "GPU": 4.0})
    assert (placed.concurrency, placed.memory_fraction, placed.workers) == (8, 0.45, 1)


def test_several_gpus_or_workers_make_a_data_parallel_trial() -> None:
    placed = resolve(res(gpus_per_trial=2), {"CPU": 8.0, "GPU": 4.0})
    assert (placed.workers, placed.cpus_per_trial, placed.concurrency, placed.num_threads) == (
        2,
        2.0,
        2,
        1,
    )
    cpu = resolve(res(workers_per_trial=2, cpus_per_trial=2), {"CPU": 2.0})
    assert (cpu.workers, cpu.gpus_per_trial, cpu.concurrency, cpu.num_threads) == (2, 0.0, 1, 1)
    single = resolve(res(gpus_per_trial=2), {"CPU": 8.0, "GPU": 4.0}, data_parallel=False)
    assert single.workers == 1  # one process holds both GPUs (TensorFlow: MirroredStrategy)
    with pytest.raises(PlacementError, match="workers_per_trial"):
        resolve(res(workers_per_trial=2), {"CPU": 2.0}, data_parallel=False)


def test_an_in_process_trainable_gets_one_process_holding_every_replica() -> None:
    # TensorFlow's MirroredStrategy: one process, the model mirrored over the trial's devices
    gpus = resolve(res(gpus_per_trial=2), {"CPU": 8.0, "GPU": 4.0}, data_parallel=IN_PROCESS)
    assert (gpus.workers, gpus.replicas, gpus.cpus_per_trial, gpus.num_threads) == (1, 2, 2.0, 2)
    assert gpus.share.replicas == 2 and gpus.concurrency == 2
    cpu = resolve(
        res(workers_per_trial=2, cpus_per_trial=2), {"CPU": 2.0}, data_parallel=IN_PROCESS
    )
    assert (cpu.workers, cpu.replicas, cpu.num_threads, cpu.concurrency) == (1, 2, 2, 1)
    assert resolve(res(), {"CPU": 2.0}, data_parallel=IN_PROCESS).share.replicas == 1


def test_gpus_asked_of_a_cluster_without_any_is_one_line() -> None:
    with pytest.raises(PlacementError) as err:
        resolve(res(gpus_per_trial=0.5), {"CPU": 2.0})
    assert isinstance(err.value, SearchError) and "\n" not in str(err.value)


# ---- on the session's Ray (2 CPUs, no GPU) ----------------------------------------------------


@pytest.mark.ray
@pytest.mark.parametrize(("max_concurrent", "threads"), [(None, 1), (1, 2)])
def test_auto_on_cpu_sets_each_trials_threads_to_its_cpu_share(
    ray_local: None, tmp_path: Path, max_concurrent: int | None, threads: int
) -> None:
    trace = tmp_path / "trace"
    resources = {
        "gpus_per_trial": "auto",
        **({"max_concurrent": max_concurrent} if max_concurrent else {}),
    }
    spec = parse_spec(
        base_spec(
            tmp_path,
            budget={"trials": 2, "max_epochs": 1},
            resources=resources,
            fixed={"trace_dir": str(trace)},
        )
    )
    run_study(spec, RunOptions(results_dir=tmp_path / "results", progress=False))
    records = [json.loads(p.read_text()) for p in trace.glob("trial-*.json")]
    assert len(records) == 2
    assert {(r["device"], r["num_threads"], r["gpu_share"]) for r in records} == {
        ("cpu", threads, None)
    }
    study = optuna.load_study(study_name="t", storage=spec.storage)
    assert [t.user_attrs["device"] for t in study.trials] == ["cpu", "cpu"]


# ---- 4 logical GPUs, in one subprocess with its own Ray ---------------------------------------

DRIVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from search.handover.export import export_study
    from search.tuning.runner import RunOptions, init_ray, run_study
    from search.specs.schema import load_spec

    init_ray(None, num_cpus=2, num_gpus=4)
    for path in sys.argv[1:]:
        spec, out = load_spec(path), Path(path).parent
        run_study(spec, RunOptions(results_dir=out / "results", progress=False))
        if spec.study == "confirm":
            export_study(spec.study, spec.storage, out / "export", top_k=1, seeds=1,
                         results_dir=out / "results", log=lambda line: None)
    """
)


def _spec(tmp: Path, name: str, trials: int, resources: dict, fixed: dict) -> Path:
    data = base_spec(
        tmp,
        study=name,
        budget={"trials": trials, "max_epochs": 2},
        asha={"enabled": False},
        resources=resources,
        fixed=fixed,
    )
    path = tmp / f"{name}.yaml"
    path.write_text(json.dumps(data))
    return path


def _max_overlap(records: list[dict]) -> int:
    events = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


@pytest.fixture(scope="module")
def on_logical_gpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One Ray of 4 logical GPUs (its start paid once) runs three studies one after the
    other: ``packed`` (8 trials of half a GPU), ``oom`` (2 trials out of memory at a quarter
    GPU) and ``confirm`` (1 trial, then its export's confirmation run); their folder."""
    tmp = tmp_path_factory.mktemp("gpus")
    packed = _spec(
        tmp,
        "packed",
        8,
        {"cpus_per_trial": 0.25, "gpus_per_trial": 0.5},
        {"trace_dir": str(tmp / "packed"), "wait_for": 8},
    )
    oom = _spec(
        tmp,
        "oom",
        2,
        {"cpus_per_trial": 0.25, "gpus_per_trial": 0.25},
        {"trace_dir": str(tmp / "oom"), "oom_below_share": 0.5},
    )
    resources = {"cpus_per_trial": 1, "gpus_per_trial": 0.5}
    confirm = _spec(tmp, "confirm", 1, resources, {"trace_dir": str(tmp / "trace")})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(packed), str(oom), str(confirm)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp


@pytest.mark.slow
def test_half_gpus_on_four_logical_gpus_run_eight_trials_at_once(on_logical_gpus: Path) -> None:
    tmp_path = on_logical_gpus
    packed_trace, oom_trace = tmp_path / "packed", tmp_path / "oom"
    records = [json.loads(p.read_text()) for p in packed_trace.glob("trial-*.json")]
    assert len(records) == 8 and all(r["end"] for r in records)
    # the barrier (wait_for: 8) passed, so all 8 ran at once; the trace shows it too
    assert _max_overlap(records) == 8
    # each trial saw the GPU Ray assigned: one id in CUDA_VISIBLE_DEVICES, two trials per GPU
    assert Counter(r["cuda_visible_devices"] for r in records) == {g: 2 for g in "0123"}
    assert {(r["device"], r["gpu_share"], r["gpu_memory_fraction"]) for r in records} == {
        ("cuda", 0.5, 0.45)
    }
    # the framework applied the cap before the trainable ran, without code of its own
    assert {(r["ctx_gpu_memory_fraction"], r["alloc_conf"]) for r in records} == {
        (0.45, "per_process_memory_fraction:0.45")
    }
    study = optuna.load_study(study_name="packed", storage=f"sqlite:///{tmp_path}/optuna.db")
    seen = {r["trial"]: r["cuda_visible_devices"] for r in records}
    assert len(study.trials) == 8
    for t in study.trials:
        assert t.state.name == "COMPLETE"
        assert t.user_attrs["device"] == f"cuda ({seen[t.number]})"  # what Ray assigned
        assert t.user_attrs["limits"] == {"threads": 1, "gpu_memory_fraction": 0.45}

    # out of memory at a quarter GPU: retried by Tune at half a GPU, COMPLETE, one trial each
    study = optuna.load_study(study_name="oom", storage=f"sqlite:///{tmp_path}/optuna.db")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert [t.user_attrs["retries"] for t in study.trials] == [1, 1]
    attempts = sorted(
        (r["trial"], r["gpu_share"], r["gpu_memory_fraction"], r["alloc_conf"])
        for r in (json.loads(p.read_text()) for p in oom_trace.glob("*.json"))
    )
    cap = "per_process_memory_fraction:"
    assert attempts == [
        (0, 0.25, 0.2, cap + "0.2"),
        (0, 0.5, 0.4, cap + "0.4"),
        (1, 0.25, 0.2, cap + "0.2"),
        (1, 0.5, 0.4, cap + "0.4"),
    ]


@pytest.mark.slow
def test_confirmation_runs_get_the_threads_and_memory_cap_of_trials(
    on_logical_gpus: Path,
) -> None:
    tmp_path = on_logical_gpus
    trace = tmp_path / "trace"
    storage = f"sqlite:///{tmp_path}/optuna.db"
    trials = optuna.load_study(study_name="confirm", storage=storage).trials
    confirms = confirm_storage(tmp_path / "results", "confirm")  # results/confirm/confirm.db
    confirm = optuna.load_study(study_name="confirm-confirm", storage=confirms).trials
    cap = {"threads": 1, "gpu_memory_fraction": 0.45}
    assert [t.user_attrs["limits"] for t in trials] == [cap]
    assert [(t.state.name, t.user_attrs["limits"]) for t in confirm] == [("COMPLETE", cap)]
    # what the trainable saw in its process: the trial and the confirmation run, half a GPU each
    seen = [json.loads(p.read_text()) for p in trace.glob("trial-*.json")]
    on_gpu = [
        (r["num_threads"], r["gpu_share"], r["alloc_conf"]) for r in seen if r["device"] == "cuda"
    ]
    assert on_gpu == [(1, 0.5, "per_process_memory_fraction:0.45")] * 2


@pytest.mark.torch
def test_the_memory_measurement_is_skipped_without_cuda() -> None:
    from search.compute.gpu_memory import measure_peak
    from search.contract.dataset import load_digits

    config = largest_config(
        parse_spec(
            base_spec(Path("."), trainable="torch_cnn", space={"batch_size": {"choice": [32, 256]}})
        ).space,
        {"channels": 8},
    )
    assert measure_peak(TrialJob("torch_cnn", 1), config, load_digits(0.2, 0)) is None
