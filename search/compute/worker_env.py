"""The environment every worker of the connected Ray inherits from its raylet.

A raylet starts each worker with its own environment, so a ``runtime_env`` whose variables
all are there already, with the same values, only costs: Ray then starts the worker through
its ``setup_worker.py`` shim, a second Python start that imports Ray (about 0.4 CPU-s a
worker, measured on this project's 2-CPU machine: 0.4 CPU-s at ready without one, 0.8 with
``env_vars`` of one variable). :func:`worker_env` is what
:func:`search.tuning.actors.inherited_env` compares Tune's variables with:

- the local Ray this process started: the environment it had at ``ray.init``
  (:data:`search.compute.cluster.LOCAL_ENV`);
- a Ray it joined whose every node runs on this machine (``ray start`` in a shell, a
  notebook's Ray, a test session's): what all their raylets share, read from ``/proc``;
- any other cluster, or raylets another user runs: nothing, so Tune's own registration stands.

Example:
    >>> common([{"A": "1", "B": "2"}, {"A": "1", "B": "3"}])
    {'A': '1'}
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

from search.compute.cluster import LOCAL_ENV, local_ray_processes

SOCKET_FLAG = b"--raylet_socket_name="
"""How a raylet's command line names its socket (``ray.nodes()``' ``RayletSocketName``)."""


def worker_env() -> dict[str, str]:
    """What every worker of the connected Ray inherits (the module's docstring); empty when
    that is not known."""
    if LOCAL_ENV and local_ray_processes():
        return dict(LOCAL_ENV)
    import ray

    if not ray.is_initialized():
        return {}
    sockets = [n.get("RayletSocketName", "") for n in ray.nodes() if n.get("Alive")]
    envs = raylet_envs(sockets)
    return common(envs) if envs and len(envs) == len(sockets) else {}


def raylet_envs(sockets: Sequence[str]) -> list[dict[str, str]]:
    """The environment of each raylet on this machine whose socket is one of ``sockets``,
    as far as ``/proc`` lets this user read it."""
    wanted = {SOCKET_FLAG + s.encode() for s in sockets if s}
    found: list[dict[str, str]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if wanted.isdisjoint((entry / "cmdline").read_bytes().split(b"\0")):
                continue
            found.append(_environ((entry / "environ").read_bytes()))
    return found


def common(envs: Sequence[dict[str, str]]) -> dict[str, str]:
    """The variables every one of ``envs`` has, with one value."""
    first, *rest = envs
    return {k: v for k, v in first.items() if all(e.get(k) == v for e in rest)}


def _environ(raw: bytes) -> dict[str, str]:
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, _, value in pairs}
