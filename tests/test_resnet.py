"""``torch_resnet`` on the generated ``shapes`` data: the data, the trainable, and its tiny
space through ``python -m search run`` (joining the session's Ray), where the data is loaded
once per worker process, not once per trial."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from search.contract.dataset import load_shapes
from search.contract.shapes import CLASSES, generate
from search.errors import SpecError
from search.specs.schema import parse_spec
from tests.helpers import REPO, base_spec

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

TINY = {"width": 8, "depth": 2, "lr": 1e-2, "batch_size": 64, "data_placement": "device"}


def test_shapes_are_deterministic_balanced_and_harder_with_difficulty() -> None:
    x, y = generate(200, 0.5, 16)
    again, _ = generate(200, 0.5, 16)
    assert np.array_equal(x, again)  # a pure function of its arguments
    assert np.bincount(y).tolist() == [20] * len(CLASSES)
    easy, hard = generate(200, 0.0, 16)[0], generate(200, 1.0, 16)[0]
    # noise and texture grow with difficulty: neighbouring pixels differ more
    roughness = [np.abs(np.diff(a, axis=-1)).mean() for a in (easy, x, hard)]
    assert roughness[0] < roughness[1] < roughness[2]
    with pytest.raises(ValueError, match="difficulty"):
        generate(20, 1.5)


def test_the_spec_names_shapes_and_refuses_its_fields_elsewhere(tmp_path: Path) -> None:
    data = {"name": "shapes", "samples": 100, "difficulty": 0.2}
    spec = parse_spec({**base_spec(tmp_path), "data": data})
    assert (spec.data.name, spec.data.samples, spec.data.difficulty) == ("shapes", 100, 0.2)
    with pytest.raises(SpecError, match="data.samples: only the generated shapes"):
        parse_spec({**base_spec(tmp_path), "data": {"name": "digits", "samples": 100}})


def test_the_resnet_learns_the_shapes_and_says_where_its_data_came_from() -> None:
    from search.contract import TrialContext
    from trainables.torch import device_data
    from trainables.torch.resnet import train

    data = load_shapes(0.2, 0, samples=400, difficulty=0.2)
    rows = list(train(TINY, data, TrialContext(max_epochs=4)))
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert all(r["train_images_per_s"] > 0 for r in rows)
    loads = device_data.CACHE.loads
    again = list(train({**TINY, "lr": 1e-3}, data, TrialContext(max_epochs=1)))
    assert (rows[0]["data_cached"], again[0]["data_cached"]) == (0.0, 1.0)
    assert device_data.CACHE.loads == loads  # the second trial loaded nothing


@pytest.mark.ray
@pytest.mark.slow
def test_the_tiny_space_runs_from_the_command_line_with_one_load_per_worker(
    session_ray_address: str, tmp_path: Path
) -> None:
    from search.record.study import load_study
    from search.specs.schema import load_spec

    storage = f"sqlite:///{tmp_path}/o.db"
    done = subprocess.run(
        [sys.executable, "-m", "search", "run", "spaces/resnet_tiny.yaml",
         "--results", str(tmp_path / "r"), "--storage", storage, "--address",
         session_ray_address],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    spec = load_spec(REPO / "spaces" / "resnet_tiny.yaml")
    trials = load_study(spec.study, storage).trials
    assert len(trials) == spec.budget.trials
    assert {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}
    cached = [t.user_attrs["metrics"]["data_cached"] for t in trials]
    # two trials at once on the session's 2 CPUs: each reused worker loads the data once
    assert 1 <= cached.count(0.0) <= 2 < len(trials)
