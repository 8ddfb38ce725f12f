"""TensorFlow and Keras trainables in one reused Ray worker process: every trial and every
confirmation run gets its limits and its seed on the first try.

The trainable (:mod:`search.testing.keras_trainables`) imports Keras or TensorFlow inside its
function, as a user's project does: a Keras ``fit`` or a ``GradientTape`` loop (the knob
``kind``), one trial at a time, so the same process runs both.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from search.handover.export import export_study
from search.record.study import CONFIRM_SUFFIX, confirm_storage, load_study
from search.specs.schema import parse_spec
from search.tuning.options import RunOptions
from search.tuning.runner import run_study

pytestmark = [
    pytest.mark.tf,
    pytest.mark.skipif(
        importlib.util.find_spec("tensorflow") is None, reason="tensorflow is not installed"
    ),
]

TRIALS = 4


@pytest.fixture(scope="module")
def searched(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """Four trials of two epochs, one at a time (one reused worker), then an export of the
    top two configs (a Keras one and a GradientTape one) with two seeds each."""
    tmp = tmp_path_factory.mktemp("tfreuse")
    spec = parse_spec(
        {
            "study": "tfreuse",
            "trainable": "search.testing.keras_trainables:either",
            "data": {"loader": "search.testing.keras_trainables:blobs"},
            "objective": {"metric": "val_accuracy", "mode": "max"},
            "budget": {"trials": TRIALS, "max_epochs": 2},
            "asha": {"enabled": False},
            "sampler": {"name": "random", "seed": 0},
            "storage": f"sqlite:///{tmp}/optuna.db",
            "resources": {"cpus_per_trial": 1, "max_concurrent": 1},
            "space": {
                "lr": {"loguniform": [0.01, 0.1]},
                "kind": {"choice": ["fit", "tape"]},
            },
        }
    )
    run_study(spec, RunOptions(results_dir=tmp / "results", progress=False))
    return spec, tmp


def test_every_trial_completes_on_its_first_try(searched: tuple[Any, Path]) -> None:
    spec, _ = searched
    trials = load_study(spec.study, spec.storage).trials
    assert len(trials) == TRIALS
    kinds = [t.params["kind"] for t in trials]
    assert {"fit", "tape"} == set(kinds) and kinds[0] != kinds[1], kinds  # both, interleaved
    for t in trials:
        assert t.state.name == "COMPLETE", t.user_attrs.get("fail_reason")
        assert t.user_attrs["retries"] == 0, t.number
        assert t.user_attrs["limits"]["threads"] == 1
        log = Path(t.user_attrs["log"]).read_text()
        assert "could not apply" not in log and "RecursionError" not in log, log[-2000:]


def test_export_confirms_every_run_it_was_asked_for(searched: tuple[Any, Path]) -> None:
    import optuna

    spec, tmp = searched
    lines: list[str] = []
    result = export_study(
        spec.study,
        spec.storage,
        tmp / "bundle",
        top_k=TRIALS,  # Keras and GradientTape configs, one after the other in one worker
        seeds=1,
        results_dir=tmp / "results",
        log=lines.append,
    )
    assert [r.failed for r in result.rows] == [0] * TRIALS, lines
    confirm = optuna.load_study(
        study_name=spec.study + CONFIRM_SUFFIX,
        storage=confirm_storage(tmp / "results", spec.study),
    )
    runs = {t.user_attrs["source_trial"]: t for t in confirm.trials}
    assert len(runs) == TRIALS, lines
    for t in runs.values():
        assert t.state.name == "COMPLETE" and t.user_attrs["retries"] == 0, t.user_attrs
    # the final model, trained in this process with the chosen run's seed, starts where the
    # chosen run started in its worker: both were seeded alike
    chosen = runs[result.chosen.source_trial].user_attrs["final_metrics"]["first_weight"]
    assert result.final["first_weight"] == chosen
