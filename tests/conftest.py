"""Shared fixtures: one local Ray per test session, deterministic seeds, spec helpers."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

try:  # torchvision must be imported before TensorFlow: the other order segfaults (triton)
    import torch  # noqa: F401
    import torchvision  # noqa: F401
except ImportError:  # a run without the torch extra still collects the framework's tests
    pass

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _seeded() -> None:
    random.seed(0)
    np.random.seed(0)


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """A real local Ray with 2 CPUs, started once for the whole session."""
    import ray

    from search.run.runner import init_ray

    init_ray(None, num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def session_ray_address(ray_local: None) -> str:
    """The address of the session's Ray, for drivers in other processes to join."""
    import ray

    return str(ray.get_runtime_context().gcs_address)


@pytest.fixture
def joins_session_ray(session_ray_address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m search`` started by the test joins the session's Ray (``RAY_ADDRESS``, read
    by ``--address``) instead of starting a Ray of its own: about 4 s and 6 CPU-s less per
    command on 2 cores. Tests of a run's own Ray (logical GPUs, kills during Ray's start) do
    not use it."""
    monkeypatch.setenv("RAY_ADDRESS", session_ray_address)


def run_spec(spec: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m search run SPEC`` in a subprocess, results beside the spec."""
    return subprocess.run(
        [sys.executable, "-m", "search", "run", str(spec), "--results", str(spec.parent / "r")],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def write_spec(path: Path, data: dict[str, Any]) -> Path:
    """Writes ``data`` as a YAML spec file and returns its path."""
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def base_spec(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    """A small valid spec on the synthetic ``curve`` trainable, storage under ``tmp_path``."""
    spec: dict[str, Any] = {
        "study": "t",
        "trainable": "search.testing:curve",
        "objective": {"metric": "val_accuracy", "mode": "max"},
        "budget": {"trials": 4, "max_epochs": 3},
        "sampler": {"name": "random", "seed": 0},
        "storage": f"sqlite:///{tmp_path}/optuna.db",
        "space": {"x": {"uniform": [0.0, 1.0]}},
    }
    spec.update(changes)
    return spec
