"""The local Ray a run starts: no idle workers prestarted for tasks no trial runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slow]

# Counts the raylet's children that are idle Python workers (``ray::IDLE``) in the first
# seconds: for a run's Ray (init_ray), then for Ray's default (the control: the count does see
# prestarted workers when there are any).
PROBE = """
import time
from pathlib import Path
import ray
from search.run.cluster import init_ray

def idle_workers() -> int:
    raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid
    count = 0
    for proc in Path("/proc").iterdir():
        try:
            parent = int((proc / "stat").read_text().rpartition(")")[2].split()[1])
            name = (proc / "cmdline").read_bytes().split(b"\\0")[0]
        except (OSError, ValueError, IndexError):
            continue
        count += parent == raylet and name.startswith(b"ray::IDLE")
    return count

def first_idle(seconds: float) -> int:
    # the idle workers once there are any, or 0 after `seconds`
    end = time.monotonic() + seconds
    while (found := idle_workers()) == 0 and time.monotonic() < end:
        time.sleep(0.5)
    return found

init_ray(None, num_cpus=2)
ours = first_idle(8)
ray.shutdown()
ray.init(address="local", num_cpus=2, include_dashboard=False)
print(ours, first_idle(30))
"""


def test_a_runs_local_ray_prestarts_no_idle_workers() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ours, stock = (int(n) for n in done.stdout.split())
    assert stock > 0  # Ray's default does prestart: the probe sees them
    assert ours == 0
