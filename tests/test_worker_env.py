"""What a Ray's workers inherit: a driver that joins a Ray on this machine registers trial
actors without a runtime_env that only repeats it (search/compute/worker_env.py), and a
local Ray's workers run at the driver's priority (search/compute/cluster.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[1]

JOINED = """
import json, os, ray
from ray.tune.execution.class_cache import _ActorClassCache
from search.compute.worker_env import worker_env
from search.tuning.actors import inherited_env
from search.tuning.runner import init_ray

class Trainable:
    def env(self, name):
        return os.environ.get(name)

init_ray(os.environ["RAY_ADDRESS"])
with inherited_env():
    remote = _ActorClassCache().get(Trainable)
actor = remote.options(num_cpus=0).remote()
print(json.dumps({
    "options": remote._default_options,
    "inherited": worker_env().get("PL_DISABLE_FORK"),
    "worker_sees": ray.get(actor.env.remote("PL_DISABLE_FORK")),
}))
"""


def joined(address: str, **env: str) -> dict[str, object]:
    """What a driver joining ``address`` registered, and what its trial actor saw."""
    done = subprocess.run(
        [sys.executable, "-c", JOINED], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": address, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_driver_that_joins_a_ray_on_this_machine_needs_no_runtime_env(
    session_ray_address: str,
) -> None:
    seen = joined(session_ray_address)
    assert seen["inherited"] == "1"  # read from the session raylet's /proc environ
    assert "runtime_env" not in seen["options"], seen  # no setup_worker shim for its workers
    assert seen["worker_sees"] == "1"  # and the variable Tune would have set is there


def test_a_variable_the_raylet_lacks_keeps_tunes_runtime_env(session_ray_address: str) -> None:
    seen = joined(session_ray_address, RAY_CHDIR_TO_TRIAL_DIR="1")  # the session's Ray has 0
    env_vars = seen["options"]["runtime_env"]["env_vars"]  # type: ignore[index]
    assert env_vars["RAY_CHDIR_TO_TRIAL_DIR"] == "1" and env_vars["PL_DISABLE_FORK"] == "1"


def test_the_raylets_environment_is_read_by_its_socket(ray_local: None) -> None:
    import ray

    from search.compute.worker_env import raylet_envs

    sockets = [n["RayletSocketName"] for n in ray.nodes() if n["Alive"]]
    envs = raylet_envs(sockets)
    assert len(envs) == len(sockets) == 1
    assert envs[0]["PL_DISABLE_FORK"] == "1" and envs[0].get("PATH")
    assert raylet_envs(["/nonexistent/sockets/raylet"]) == []


def test_a_local_rays_workers_run_at_the_drivers_priority(ray_local: None) -> None:
    """Ray's default starts each worker 15 nicer than the driver: beside any busy program
    the trials, the run's whole work, would get almost no CPU."""
    import ray

    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert ray.get(niceness.remote()) == os.nice(0)
