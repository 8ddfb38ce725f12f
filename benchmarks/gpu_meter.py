"""What a GPU did while a study ran: SM activity from NVML, beside ``nvidia-smi``'s utilization.

``nvidia-smi``'s ``utilization.gpu`` is the share of time at least one kernel ran: one tiny
kernel at a time on one SM reads 100 %. The SM activity of NVML's GPM metrics (Hopper and
later: ``SM_UTIL``, the share of SM cycles busy, and ``SM_OCCUPANCY``, of warps resident) says
how much of the chip worked. Where the GPU has no GPM, the meter falls back to NVML's sampled
utilization (what ``nvidia-smi`` shows) and says so. It also keeps each process's GPU memory
(memory per trial), and samples ``nvidia-smi`` itself for the side-by-side figure.

Without NVML (no driver, no ``nvidia-ml-py``) or without a GPU every figure is absent and
``source`` says why: the CPU dry run of ``benchmarks/gpu_check.py`` goes through this code.
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
from typing import Any

PERIOD_S = 0.5


def _nvml() -> tuple[Any, list[Any], str]:
    """pynvml, a handle per GPU, and '' (or None, [] and why not)."""
    try:
        import pynvml
    except ImportError:
        return None, [], "no nvidia-ml-py"
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:  # NVMLError: no driver, no GPU
        return None, [], f"NVML unavailable ({exc})"
    if count == 0:
        return None, [], "no GPU"
    return pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)], ""


def _gpm_supported(nvml: Any, handle: Any) -> bool:
    try:
        return bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except Exception:  # older driver or GPU: no GPM
        return False


class Meter(threading.Thread):
    """Samples every GPU each :data:`PERIOD_S` until :meth:`stop`; :meth:`stop` returns, per
    GPU, the mean SM activity (%, GPM) and occupancy, the mean sampled utilization (NVML and
    ``nvidia-smi``), peak memory, and the peak memory of each process seen (MiB)."""

    def __init__(self, period: float = PERIOD_S) -> None:
        super().__init__(daemon=True)
        self.period = period
        self.nvml, self.handles, self.source = _nvml()
        self.gpm = [_gpm_supported(self.nvml, h) for h in self.handles]
        self.samples: list[dict[str, Any]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        previous = [self._gpm_sample(i) for i in range(len(self.handles))]
        while not self._halt.wait(self.period):
            for i, handle in enumerate(self.handles):
                row: dict[str, Any] = {"gpu": i, "t": time.time()}
                try:
                    util = self.nvml.nvmlDeviceGetUtilizationRates(handle)
                    row["util"] = float(util.gpu)
                    row["mem_mib"] = self.nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
                    procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                    row["procs"] = {p.pid: (p.usedGpuMemory or 0) / 2**20 for p in procs}
                except Exception:
                    continue
                current = self._gpm_sample(i)
                if current is not None and previous[i] is not None:
                    row.update(self._gpm_metrics(previous[i], current))
                previous[i] = current
                self.samples.append(row)
            self.samples.extend(smi_utilization())

    def _gpm_sample(self, i: int) -> Any:
        if not self.gpm or not self.gpm[i]:
            return None
        sample = self.nvml.nvmlGpmSampleAlloc()
        self.nvml.nvmlGpmSampleGet(self.handles[i], sample)
        return sample

    def _gpm_metrics(self, first: Any, second: Any) -> dict[str, float]:
        nvml = self.nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 2
        request.sample1, request.sample2 = first, second
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        request.metrics[1].metricId = nvml.NVML_GPM_METRIC_SM_OCCUPANCY
        try:
            nvml.nvmlGpmMetricsGet(request)
        except Exception:
            return {}
        finally:
            nvml.nvmlGpmSampleFree(first)
        return {"sm_active": request.metrics[0].value, "sm_occupancy": request.metrics[1].value}

    def stop(self) -> dict[str, Any]:
        """Stops sampling and summarizes (``source`` says where SM activity came from)."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=10)
        gpus: dict[int, dict[str, Any]] = {}
        for i in range(len(self.handles)):
            rows = [s for s in self.samples if s.get("gpu") == i and "util" in s]
            smi = [s["smi_util"] for s in self.samples if s.get("smi_gpu") == i]
            procs: dict[int, float] = {}
            for row in rows:
                for pid, mib in row.get("procs", {}).items():
                    procs[pid] = max(procs.get(pid, 0.0), mib)
            gpus[i] = {
                "sm_active_mean": _mean(r.get("sm_active") for r in rows),
                "sm_occupancy_mean": _mean(r.get("sm_occupancy") for r in rows),
                "nvml_util_mean": _mean(r["util"] for r in rows),
                "smi_util_mean": _mean(smi),
                "mem_peak_mib": max((r["mem_mib"] for r in rows), default=None),
                "mib_per_process_median": statistics.median(procs.values()) if procs else None,
                "processes": len(procs),
                "samples": len(rows),
                "sm_source": "GPM SM_UTIL" if self.gpm[i] else "NVML utilization (no GPM)",
            }
        return {"source": self.source or "NVML", "gpus": gpus}


def _mean(values: Any) -> float | None:
    numbers = [float(v) for v in values if v is not None]
    return round(statistics.mean(numbers), 1) if numbers else None


def smi_utilization() -> list[dict[str, float]]:
    """One ``nvidia-smi --query-gpu=utilization.gpu`` reading per GPU (none without it)."""
    cmd = ["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits"]
    try:
        text = subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = []
    for line in text.strip().splitlines():
        try:
            index, util = (float(part) for part in line.split(","))
        except ValueError:
            continue
        rows.append({"smi_gpu": int(index), "smi_util": util})
    return rows
