"""On a GPU machine: is every GPU busy? The ResNet study, and ``gpus_per_trial: auto``.

The default check (``--only resnet``, :mod:`benchmarks.gpu_resnet`) is one command within 8
minutes of device time, everything under ``--out`` (``results/benchmarks/gpu_check``): the
solo ceiling of ``torch_resnet`` on the CIFAR-sized shapes data, the study at ``auto``
against fixed packings of 1, 2, 4, 8 and 16 trials per GPU and against stock Ray Tune with
a fractional ``gpus_per_trial``, full 10-epoch trials, trials per hour per GPU at 1 and N
GPUs; each with SM activity from NVML (GPM where the GPU has it, :mod:`benchmarks.gpu_meter`)
beside ``nvidia-smi``'s utilization, images per second summed over trials, memory per trial,
and a torch.profiler trace of trial 0 attached to it for optuna-dashboard.
``--dry-run`` runs the same code on this CPU at a tiny size (one logical GPU), as
``tests/test_gpu_check.py`` does.

The older checks:

Prints the GPUs found, what ``auto`` decided (the largest config's peak memory, trials packed
per GPU, memory cap per trial), GPU utilization sampled from ``nvidia-smi`` every half second
during the study (mean and peak per GPU), the epoch time of one config in fp32, bf16 and
fp16, and trials per hour. Then a user's TensorFlow trainable (``examples/keras_fit``: Keras
imported inside its function) packed at ``gpus_per_trial: 0.5``: the memory cap each trial
got (its user attribute ``limits``: the share, and the logical GPU TensorFlow was given)
against the share of the GPU's memory it should be. Writes results/benchmarks/gpu_check.json.
Without a GPU it says so and exits 0.

    python benchmarks/gpu_check.py                       # the ResNet study (8 minutes)
    python benchmarks/gpu_check.py --dry-run             # the same on this CPU, tiny
    python benchmarks/gpu_check.py --only digits --trials 64 --epochs 27
    python benchmarks/gpu_check.py --only tf --tf-trials 4   # the TensorFlow cap only
    python benchmarks/gpu_check.py --only fused          # fused arrays of 1 to 32 members

``--only fused`` (issue 44) measures one fused array of the digits CNN at 1, 4, 8, 16 and 32
members against the same trials' epochs one after another on the GPU
(:func:`benchmarks.fused.step_rates`), with SM activity metered over the whole of it; then
the digits study at a fixed shape (64 trials x 9 epochs) cold from the command line as
``fuse: auto`` (with the decision line it printed), as packed processes (``fuse: off``,
``gpus_per_trial: auto``) and one trial per GPU. The dry run does 1 and 2 members on the
CPU and the first two studies at 4 trials x 2 epochs on one logical GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `python benchmarks/gpu_check.py`: the benchmarks package too
OUT = REPO / "results" / "benchmarks"
SPACE = REPO / "spaces" / "cnn.yaml"
TF_SPACE = REPO / "examples" / "keras_fit" / "space.yaml"
TF_SHARE = 0.5


def gpus() -> list[str]:
    """The CUDA devices PyTorch sees, by name (empty without CUDA)."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


class UtilizationSampler(threading.Thread):
    """Samples ``nvidia-smi --query-gpu=utilization.gpu,memory.used`` every ``period`` s."""

    def __init__(self, period: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.period, self.samples = period, []  # type: ignore[var-annotated]
        self._stop_event = threading.Event()

    def run(self) -> None:
        cmd = [
            "nvidia-smi",
            "--query-gpu=index,utilization.gpu,memory.used",
            "--format=csv,noheader,nounits",
        ]
        while not self._stop_event.is_set():
            try:
                text = subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.TimeoutExpired):
                return
            for line in text.strip().splitlines():
                index, util, mem = (part.strip() for part in line.split(","))
                self.samples.append((int(index), float(util), float(mem)))
            self._stop_event.wait(self.period)

    def stop(self) -> dict[int, dict[str, float]]:
        """Stops sampling; per GPU: mean and peak utilization (%), peak memory (MiB)."""
        self._stop_event.set()
        self.join(timeout=10)
        out: dict[int, dict[str, float]] = {}
        for index in sorted({s[0] for s in self.samples}):
            utils = [s[1] for s in self.samples if s[0] == index]
            mems = [s[2] for s in self.samples if s[0] == index]
            out[index] = {
                "util_mean": round(statistics.mean(utils), 1),
                "util_peak": max(utils),
                "mem_peak_mib": max(mems),
            }
        return out


def epoch_times(
    precisions: tuple[str, ...] = ("fp32", "bf16", "fp16"), epochs: int = 4
) -> dict[str, float]:
    """Median epoch time (s) of one mid-sized config of the space on GPU 0, per precision
    (the first epoch, with its warm-up, is left out)."""
    from search.contract import TrialContext
    from search.contract.dataset import load_digits
    from trainables.torch.cnn import train

    data = load_digits(0.2, 0)
    config = {"channels": 16, "batch_size": 64, "optimizer": "adam", "lr": 3e-3}
    out = {}
    for precision in precisions:
        ctx = TrialContext(max_epochs=epochs, device="cuda", num_threads=1)
        times = [m["epoch_time_s"] for m in train({**config, "precision": precision}, data, ctx)]
        out[precision] = round(statistics.median(times[1:] or times), 4)
    return out


def gpu_total_mib() -> float | None:
    """GPU 0's memory, from ``nvidia-smi`` (None without it)."""
    cmd = ["nvidia-smi", "--id=0", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
    try:
        return float(
            subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.split()[0]
        )
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def tf_packed(trials: int, tmp: Path) -> dict[str, Any]:
    """A user's TensorFlow trainable at ``gpus_per_trial: 0.5``: the cap each trial got."""
    from search.compute.placement import memory_fraction
    from search.record.study import load_study
    from search.specs.schema import load_spec, with_overrides
    from search.tuning.runner import RunOptions, run_study

    spec = with_overrides(
        load_spec(TF_SPACE),
        **{
            "budget.trials": trials,
            "budget.max_epochs": 3,
            "resources.gpus_per_trial": TF_SHARE,
            "resources.cpus_per_trial": 1,
            "storage": f"sqlite:///{tmp}/optuna.db",
            "study": "gpu-check-tf",
        },
    )
    run_study(spec, RunOptions(results_dir=tmp / "results", progress=False))
    total, fraction = gpu_total_mib(), memory_fraction(TF_SHARE)
    expected = int(fraction * total) if fraction and total else None
    rows = []
    for t in load_study("gpu-check-tf", spec.storage).trials:
        limits = t.user_attrs.get("limits", {})
        rows.append(
            {
                "trial": t.number,
                "state": t.state.name,
                "device": t.user_attrs.get("device"),
                "gpu_memory_fraction": limits.get("gpu_memory_fraction"),
                "tf_memory_limit_mb": limits.get("tf_memory_limit_mb"),
                "tf_kept": limits.get("tf_kept"),
            }
        )
        print(
            f"  TF trial {t.number} {t.state.name} on {rows[-1]['device']}: memory fraction "
            f"{rows[-1]['gpu_memory_fraction']}, TensorFlow capped at "
            f"{rows[-1]['tf_memory_limit_mb']} MiB (expected {expected} MiB"
            f" = {fraction} x {total} MiB)"
        )
    capped = sum(r["tf_memory_limit_mb"] == expected and expected is not None for r in rows)
    print(f"TF at gpus_per_trial {TF_SHARE}: {capped} of {len(rows)} trials got the cap")
    return {"share": TF_SHARE, "expected_mb": expected, "capped": capped, "trials": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="the same code on this CPU, tiny")
    parser.add_argument("--out", type=Path, default=OUT / "gpu_check", help="the one folder")
    parser.add_argument("--seconds", type=float, help="seconds of each study (default by size)")
    parser.add_argument("--trials", type=int, default=32, help="trials of --only digits")
    parser.add_argument("--epochs", type=int, default=9, help="epochs of --only digits")
    parser.add_argument("--tf-trials", type=int, default=4, help="trials of --only tf")
    parser.add_argument(
        "--only", choices=("resnet", "digits", "tf", "fused"), default="resnet",
        help="resnet (default): the ResNet study; digits: auto on the CNN space; tf: TF's cap",
    )  # fmt: skip
    args = parser.parse_args(argv)
    found = gpus()
    if not found and not args.dry_run:
        print(
            "no GPU: PyTorch sees no CUDA device on this machine, so there is nothing to "
            "check here (gpus_per_trial: auto runs such studies on CPUs). Run this on a GPU "
            "machine, or --dry-run for the same code at a tiny size on this CPU."
        )
        return
    print(f"GPUs found: {len(found)}" + (" (dry run on the CPU)" if args.dry_run else ""))
    for i, name in enumerate(found):
        print(f"  cuda:{i}  {name}")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"gpus": found, "dry_run": args.dry_run, "load": os.getloadavg()}
    if args.only == "resnet":
        result["resnet"] = resnet_check(found, out, args.dry_run, args.seconds)
    elif args.only == "fused":
        result["fused"] = fused_check(args.dry_run)
    else:
        from search.tuning.runner import init_ray

        tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        init_ray(None)
        if args.only == "digits":
            result.update(auto_study(args.trials, args.epochs, tmp))
        else:
            result["tf_packed"] = tf_packed(args.tf_trials, tmp)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {out / 'gpu_check.json'}")


def fused_check(dry: bool) -> dict[str, Any]:
    """Fused arrays against one trial after another on the GPU, SM activity metered; then the
    same digits study cold from the command line three ways: ``fuse: auto`` (its decision
    line kept), the trials as packed processes (``fuse: off``, ``gpus_per_trial: auto``) and
    one trial per GPU. The dry run joins one local Ray of a logical GPU, at a tiny budget."""
    from benchmarks.fused import run_cold, step_rates
    from benchmarks.gpu_meter import Meter

    meter = Meter()
    meter.start()
    rows = step_rates([1, 2] if dry else [1, 4, 8, 16, 32], "cpu" if dry else "cuda")
    env = dry_ray() if dry else {"CUDA_VISIBLE_DEVICES": "0"}
    trials, epochs = (4, 2) if dry else (64, 9)
    studies = []
    contenders: list[tuple[Any, Any]] = [("auto", "auto"), (None, "auto"), (None, 1)]
    for fuse, gpus in contenders[:2] if dry else contenders:  # one per GPU: placement's tests
        studies.append(run_cold(trials, epochs, 0, fuse, gpus, env))
        print(studies[-1], flush=True)
    return {"rates": rows, "studies": studies, "meter": meter.stop()}


def resnet_check(found: list[str], out: Path, dry: bool, seconds: float | None) -> dict[str, Any]:
    """The ResNet study (:mod:`benchmarks.gpu_resnet`): solo ceiling, auto against fixed
    packings and stock Ray Tune, full-length trials, and trials per hour per GPU at 1 and N
    GPUs. The dry run joins one local Ray of a logical GPU; on a GPU every study starts its
    own, cold, on GPU 0 (all GPUs for the N-GPU row)."""
    from benchmarks import gpu_resnet

    size = "dry" if dry else "gpu"
    if seconds:
        gpu_resnet.SIZES[size]["seconds"] = seconds
    s = gpu_resnet.SIZES[size]
    env: dict[str, str] = {"GPU_CHECK_SECONDS": str(s["seconds"])}
    if found:
        env["CUDA_VISIBLE_DEVICES"] = "0"
    if dry:
        env.update(dry_ray())
    report: dict[str, Any] = {"size": size, "seconds": s["seconds"]}
    report["solo"] = gpu_resnet.in_process("solo", size, out, 0.0, env)
    ceiling = report["solo"]["ceiling_images_per_s"]
    print(f"solo ceiling: {ceiling:,.0f} images/s ({report['solo']['best']}); {report['solo']}")
    if dry:
        report["probe"] = dry_probe(out)
        print(f"auto's throughput probe on a logical GPU: {report['probe']}")
    rows = [gpu_resnet.run_contender(size, "auto", out, "auto", env=env)]
    rows += [
        gpu_resnet.run_contender(size, f"fixed-{k}", out, round(1.0 / k, 4), env=env)
        for k in s["packings"]
    ]
    rows.append(gpu_resnet.run_contender(size, "auto-full", out, "auto", asha=False, env=env))
    rows.append(gpu_resnet.in_process("stock", size, out, s["stock_share"], env))
    if len(found) > 1:
        all_gpus = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
        rows.append(gpu_resnet.run_contender(size, "auto-all-gpus", out, "auto", env=all_gpus))
    for row in rows:
        row["share_of_ceiling"] = round(row["images_per_s"] / ceiling, 3) if ceiling else None
        row["trials_per_hour_per_gpu"] = row["trials_per_hour"] / (
            len(found) if row["name"] == "auto-all-gpus" else 1
        )
        print(summary(row))
    report["studies"] = rows
    return report


def summary(row: dict[str, Any]) -> str:
    """One line of a contender: images/s, share of the ceiling, trials/h, SM activity."""
    gpus = (row.get("meter") or {}).get("gpus") or {}
    sm = (
        ", ".join(
            f"GPU {i}: SM {g['sm_active_mean']} % ({g['sm_source']}), nvidia-smi "
            f"{g['smi_util_mean']} %, {g['mib_per_process_median']} MiB per process"
            for i, g in gpus.items()
        )
        or f"no GPU meter ({(row.get('meter') or {}).get('source')})"
    )
    return (
        f"{row['name']:>18}: {row['images_per_s']:>9,.0f} images/s summed "
        f"({row['share_of_ceiling']} of solo), {row['trials_per_hour']:,.0f} trials/h "
        f"({row['finished']} finished of {row['trials']}); {sm}"
        + (f"\n{'':>20}{row['decision']}" if row.get("decision") else "")
    )


def dry_ray() -> dict[str, str]:
    """A local Ray of 2 CPUs and one logical GPU that every dry-run contender joins."""
    import ray

    from search.tuning.runner import init_ray

    init_ray(None, num_cpus=2, num_gpus=1)
    return {"RAY_ADDRESS": str(ray.get_runtime_context().gcs_address)}


def dry_probe(out: Path) -> dict[int, float]:
    """``auto``'s throughput measurement of the tiny space's largest config on the logical
    GPU, 1 and 2 at once (on a GPU, ``auto`` runs it before its study)."""
    from benchmarks import gpu_resnet
    from search.compute.data import load_data, share
    from search.compute.gpu_memory import largest_config
    from search.compute.gpu_rates import measure_rates
    from search.specs.schema import parse_spec

    spec = parse_spec(gpu_resnet.spec_dict("dry", "probe", out, "auto"))
    config = largest_config(spec.space, spec.fixed)
    return measure_rates(spec, share(load_data(spec.data)), config, fit=2)


def auto_study(trials: int, epochs: int, tmp: Path) -> dict[str, Any]:
    """``gpus_per_trial: auto`` on the CNN space: the packing, utilization, trials per hour."""
    from search.compute.data import load_data
    from search.record.study import load_study
    from search.specs.schema import load_spec, with_overrides
    from search.tuning.fit import place
    from search.tuning.runner import RunOptions, run_study

    spec = with_overrides(
        load_spec(SPACE),
        **{
            "budget.trials": trials,
            "budget.max_epochs": epochs,
            "resources.gpus_per_trial": "auto",
            "storage": f"sqlite:///{tmp}/optuna.db",
            "study": "gpu-check",
        },
    )
    placement = place(spec, load_data(spec.data))
    packing = placement.packing
    print(f"auto: {placement.note}")
    print(
        f"  trials per GPU {packing.trials_per_gpu if packing else 1}, GPU share per trial "
        f"{placement.gpus_per_trial}, memory cap {placement.memory_fraction}, "
        f"{placement.cpus_per_trial} CPU(s) and {placement.num_threads} thread(s) per trial, "
        f"{placement.concurrency} trials at once"
    )

    sampler = UtilizationSampler() if shutil.which("nvidia-smi") else None
    if sampler:
        sampler.start()
    start = time.perf_counter()
    run_study(spec, RunOptions(results_dir=tmp / "results", progress=False))
    wall = time.perf_counter() - start
    utilization = sampler.stop() if sampler else {}
    study = load_study("gpu-check", spec.storage)
    devices = sorted({str(t.user_attrs.get("device")) for t in study.trials})
    print(
        f"study: {len(study.trials)} trials in {wall:.1f} s -> "
        f"{len(study.trials) / wall * 3600:.0f} trials per hour; devices seen {devices}"
    )
    if utilization:
        for index, u in utilization.items():
            print(
                f"  GPU {index}: utilization mean {u['util_mean']} %, peak {u['util_peak']} %, "
                f"memory peak {u['mem_peak_mib']:.0f} MiB"
            )
    else:
        print("  (nvidia-smi not found: no utilization samples)")
    times = epoch_times()
    print(
        "epoch time, one config (channels 16, batch 64, adam) on cuda:0: "
        + ", ".join(f"{p} {t * 1000:.1f} ms" for p, t in times.items())
    )
    return {
        "placement": {
            "note": placement.note,
            "gpus_per_trial": placement.gpus_per_trial,
            "trials_per_gpu": packing.trials_per_gpu if packing else 1,
            "memory_fraction": placement.memory_fraction,
            "concurrency": placement.concurrency,
        },
        "trials": len(study.trials),
        "wall_s": round(wall, 1),
        "trials_per_hour": round(len(study.trials) / wall * 3600, 1),
        "utilization": utilization,
        "epoch_time_s": times,
        "devices": devices,
    }


if __name__ == "__main__":
    sys.exit(main())
