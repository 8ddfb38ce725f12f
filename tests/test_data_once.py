"""The user's data, loaded once: one loader call per command, one copy in the driver, and
``None`` for a trainable of the user's that declares no ``data:``."""

from __future__ import annotations

import gc
import importlib
import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from search.compute.data import load_data
from search.contract import trainable
from search.handover.export import export_study
from search.specs.schema import parse_spec
from search.tuning.runner import RunOptions, run_study
from tests.helpers import base_spec, make_study

pytestmark = [pytest.mark.usefixtures("joins_session_ray")]


def counting_loader(calls: str) -> dict[str, Any]:
    """A loader that appends one line to ``calls`` each time it is called."""
    with open(calls, "a") as f:
        f.write(f"{os.getpid()}\n")
    rng = np.random.default_rng(0)
    return {"x_train": rng.normal(size=(8, 2)), "y_train": np.arange(8) % 2}


def test_a_trainable_of_the_users_without_data_gets_none(tmp_path: Path) -> None:
    spec = parse_spec(base_spec(tmp_path))  # search.testing:curve, no data:
    assert spec.data.name == "none" and load_data(spec.data) is None
    again = parse_spec(spec.to_dict())  # the stored spec keeps it
    assert again.data.name == "none"
    builtin = parse_spec({**base_spec(tmp_path), "trainable": "torch_cnn", "space": {}})
    assert builtin.data.name == "digits"  # a built-in's default is unchanged


def test_export_calls_the_loader_once_and_the_card_names_it(
    ray_local: None, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.txt"
    loader = {"loader": "tests.test_data_once:counting_loader", "args": {"calls": str(calls)}}
    values = {0.9: TrialState.COMPLETE, 0.7: TrialState.COMPLETE}
    spec, _ = make_study(tmp_path, values, data=loader, budget={"trials": 4, "max_epochs": 2})
    export_study("t", spec.storage, tmp_path / "out", results_dir=tmp_path, top_k=2, seeds=2)
    assert len(calls.read_text().splitlines()) == 1  # confirmation runs and final model share it
    env = (tmp_path / "out" / "environment.txt").read_text()
    assert "data loader tests.test_data_once:counting_loader" in env
    assert "data x_train float64 (8, 2), y_train int64 (8,)" in env


def test_without_data_the_bundle_says_the_trainable_loads_its_own(
    ray_local: None, tmp_path: Path
) -> None:
    spec, _ = make_study(
        tmp_path, {0.9: TrialState.COMPLETE}, budget={"trials": 2, "max_epochs": 2}
    )
    export_study("t", spec.storage, tmp_path / "out", results_dir=tmp_path, top_k=1, seeds=1)
    card = (tmp_path / "out" / "MODEL_CARD.md").read_text()
    assert "Data: loaded by the trainable itself" in card and "digits" not in card
    env = (tmp_path / "out" / "environment.txt").read_text()
    assert "data loaded by the trainable itself" in env and "data built-in" not in env


class Loaded(dict):
    """What :func:`weakly_loaded` returns: a dict a weak reference can follow."""


LOADED: list[weakref.ref[Loaded]] = []


def weakly_loaded() -> Loaded:
    """A loader whose result the test can watch through :data:`LOADED`."""
    data = Loaded(x_train=np.ones((1000, 100)), y_train=np.zeros(1000))
    LOADED.append(weakref.ref(data))
    return data


def test_the_driver_keeps_no_copy_of_the_data_while_trials_run(
    ray_local: None, tmp_path: Path
) -> None:
    from ray.tune import Callback

    seen: list[bool] = []

    class Watch(Callback):  # runs in the driver, in Tune's loop, while trials run
        def on_trial_start(self, iteration: int, trials: Any, trial: Any, **info: Any) -> None:
            gc.collect()  # the loader's module as the spec names it (pytest may import this apart)
            loaded = importlib.import_module("tests.test_data_once").LOADED
            seen.append(loaded[-1]() is not None)

    data = base_spec(tmp_path, data={"loader": "tests.test_data_once:weakly_loaded"})
    data["budget"] = {"trials": 2, "max_epochs": 1}
    options = RunOptions(results_dir=tmp_path / "results", progress=False, callbacks=[Watch()])
    run_study(parse_spec(data), options)
    assert seen and not any(seen)  # only Ray's object store holds it


@trainable(defaults={"width": 7, "x": 0.5})
def reads_a_default(config: Any, data: Any, ctx: Any) -> Any:
    """Reads ``width``, which only its declared defaults give (no space key, no ``fixed``)."""
    yield {"val_accuracy": float(config["width"]) + float(config["x"])}


def test_a_declared_trainables_defaults_fill_the_trials_config(
    ray_local: None, tmp_path: Path
) -> None:
    data = base_spec(tmp_path, trainable="tests.test_data_once:reads_a_default")
    data["budget"] = {"trials": 1, "max_epochs": 1}
    spec = parse_spec(data)
    run_study(spec, RunOptions(results_dir=tmp_path / "results", progress=False))
    trial = optuna.load_study(study_name="t", storage=spec.storage).trials[0]
    assert trial.state == TrialState.COMPLETE  # not KeyError: 'width'
    assert trial.value == pytest.approx(7 + trial.params["x"])


def pieces_loader(mb: int) -> dict[str, Any]:
    """``mb`` MB of training data built from pieces of 0.8 MB, as a loader that reads files one
    by one and stacks them."""
    rows = [np.full(100_000, i, dtype=np.float64) for i in range(mb * 10 // 8)]
    return {"x_train": np.stack(rows), "y_train": np.arange(len(rows)) % 2}


# A driver of its own: its memory before the run (Ray, Tune and the loader's module imported)
# and when the first trial starts (the data loaded, put in the object store, dropped).
MEMORY = """
import sys
from pathlib import Path
from ray.tune import Callback
import search.tuning.fit, tests.test_data_once
from search.compute.cluster import init_ray
from search.tuning.runner import RunOptions, run_study
from search.specs.schema import load_spec

def rss():
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) // 1024

class Watch(Callback):
    def on_trial_start(self, iteration, trials, trial, **info):
        seen.append(rss())

init_ray(sys.argv[1])
seen = [rss()]
run_study(load_spec(sys.argv[2]), RunOptions(results_dir=Path(sys.argv[3]), progress=False,
          callbacks=[Watch()]))
print(seen[0], seen[1])
"""


def test_the_drivers_memory_drops_back_once_the_data_is_in_the_object_store(
    session_ray_address: str, tmp_path: Path
) -> None:
    """300 MB of data: before, the driver's RSS stayed 2 copies higher while trials ran (the
    loader's freed arrays kept by glibc, and the object store's pages it wrote)."""
    import subprocess
    import sys

    from tests.helpers import REPO, write_spec

    data = base_spec(
        tmp_path, data={"loader": "tests.test_data_once:pieces_loader", "args": {"mb": 300}}
    )
    data["budget"] = {"trials": 1, "max_epochs": 1}
    spec = write_spec(tmp_path / "s.yaml", data)
    done = subprocess.run(
        [sys.executable, "-c", MEMORY, session_ray_address, str(spec), str(tmp_path / "r")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    before, running = (int(n) for n in done.stdout.split()[-2:])
    assert running - before < 150, (before, running)  # MB; the data alone is 300
