"""``export --pareto`` and ``export --pick`` on multi-objective studies.

The export tests run on a real study: ``search.testing:curve`` trained by a real local Ray
(``run_study``, what ``python -m search run`` calls), with ``latency`` as a parameter that the
curve yields as the constant metric ``latency_ms``: ``val_accuracy`` (max, ``0.75 x`` after
2 epochs, the same for every seed) trades off against ``latency_ms`` (min). The choice and
the refusals run on studies built directly in their storage, with the user attributes the
runner writes, so they need no Ray.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from search.handover.export import export_study
from search.handover.pareto import export_pareto
from search.handover.pick import pick_trial
from search.handover.train import ExportError
from search.record.artifacts import attached
from search.record.queries import pareto_trials
from search.record.study import (
    CONFIRM_SUFFIX,
    confirm_storage,
    load_study,
    open_study,
    record_spec,
)
from search.specs.schema import parse_spec
from search.tuning.runner import RunOptions, run_study
from tests.helpers import PARETO_POINTS as POINTS
from tests.helpers import TWO, base_spec, built_study, mo_spec
from tests.helpers import cli as _cli

# CLI runs join the session's Ray (tests/conftest.py)
pytestmark = [pytest.mark.usefixtures("joins_session_ray")]

BUNDLE = {"config.yaml", "metrics.json", "MODEL_CARD.md", "learning_curves.png", "model.json"}


@pytest.fixture(scope="module")
def searched(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """A real 12-trial study; with sampler seed 1 its front has 3 points."""
    tmp = tmp_path_factory.mktemp("mo")
    spec = mo_spec(tmp)
    run_study(spec, RunOptions(results_dir=tmp / "results", progress=False))
    study = load_study("mo", spec.storage)
    assert len(pareto_trials(study)) >= 3, "change sampler.seed: the front needs 3 points"
    return spec, study


# --- --pareto -------------------------------------------------------------------------------


@pytest.mark.ray
def test_pareto_writes_a_bundle_per_point_and_an_index(
    searched: tuple[Any, Any], tmp_path: Path
) -> None:
    spec, study = searched
    front = {t.number: t for t in pareto_trials(study)}
    lines: list[str] = []
    result = export_pareto(
        "mo", spec.storage, tmp_path / "p", seeds=2, results_dir=tmp_path, log=lines.append
    )
    assert sorted(p.trial for p in result.points) == sorted(front)
    for number, trial in front.items():
        folder = tmp_path / "p" / f"trial-{number}"
        assert {p.name for p in folder.iterdir()} >= BUNDLE, number
        saved = json.loads((folder / "metrics.json").read_text())
        confirmed = saved["pareto"]["confirmed"]
        assert confirmed["val_accuracy"]["mean"] == pytest.approx(0.75 * trial.params["x"])
        assert confirmed["latency_ms"] == {
            "mean": trial.params["latency"],
            "std": 0.0,
            "min": trial.params["latency"],
            "max": trial.params["latency"],
            "failed": 0,
        }
        assert saved["chosen"]["source_trial"] == number and len(saved["confirmation"]) == 1
        assert (
            yaml.safe_load((folder / "config.yaml").read_text())["study"] == f"mo-pareto-{number}"
        )
        assert "A point of the Pareto front" in (folder / "MODEL_CARD.md").read_text()
    rows = list(csv.DictReader((tmp_path / "p" / "pareto.csv").open()))
    assert [int(r["trial"]) for r in rows] == sorted(front, key=lambda n: -front[n].values[0])
    for r in rows:
        x, latency = front[int(r["trial"])].params.values()
        assert float(r["val_accuracy_mean"]) == pytest.approx(0.75 * x)
        assert float(r["latency_ms_mean"]) == latency and float(r["latency_ms_std"]) == 0.0
        assert r["bundle"] == f"trial-{r['trial']}" and r["confirmed_front"] == "True"
    index = (tmp_path / "p" / "PARETO.md").read_text()
    assert "| trial | val_accuracy (max) | latency_ms (min) |" in index
    assert all(f"[trial-{n}/](trial-{n}/MODEL_CARD.md)" in index for n in front)
    assert (tmp_path / "p" / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cards = attached(study)  # each point's card beside its trial, for optuna-dashboard
    assert all("MODEL_CARD.md" in cards[t._trial_id] for t in front.values())
    confirm = optuna.load_study(
        study_name="mo" + CONFIRM_SUFFIX, storage=confirm_storage(tmp_path, "mo")
    )
    assert len(confirm.trials) >= 2 * len(front)
    assert any(line.startswith(f"confirm {2 * len(front):>2}/") for line in lines)
    trained = _cli("train", str(tmp_path / "p" / f"trial-{rows[0]['trial']}" / "config.yaml"))
    assert trained.returncode == 0, trained.stderr
    assert "reproduces the exported val_accuracy" in trained.stdout


def test_pareto_on_a_single_objective_study_is_one_line_and_exit_2(tmp_path: Path) -> None:
    spec = parse_spec(base_spec(tmp_path))
    record_spec(open_study(spec), spec)
    proc = _cli("export", "t", "--storage", spec.storage, "--pareto")
    assert proc.returncode == 2
    assert proc.stderr == (
        "error: --pareto: study 't' has one objective (val_accuracy), so no Pareto front; "
        "export it without --pareto (or choose by constraints with --pick)\n"
    )


# --- --pick -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("latency_ms<16", 1),  # 0 is out; 1 is the best of 1 and 2
        ("latency_ms<=16", 0),
        ("latency_ms < 8", 2),
        ("val_loss>0.45", 2),  # a metric of the trials, not an objective
        ("latency_ms>2,val_accuracy<0.65", 1),
    ],
)
def test_pick_chooses_the_best_front_point_that_satisfies_it(
    tmp_path: Path, text: str, expected: int
) -> None:
    spec, study = built_study(tmp_path, POINTS)
    trial, constraints, _ = pick_trial(study, spec, text)
    assert trial.number == expected, [str(c) for c in constraints]


def test_pick_on_a_single_objective_study_chooses_among_every_complete_trial(
    tmp_path: Path,
) -> None:
    one = {"metric": "val_accuracy", "mode": "max"}
    spec, study = built_study(tmp_path, POINTS, objective=one)  # metrics still hold latency
    trial, _, fits = pick_trial(study, spec, "latency_ms<10")
    assert (trial.number, fits) == (1, 3)  # not a front: trial 3 (0.5, 4) counts too


@pytest.mark.parametrize(
    ("args", "stderr"),
    [
        (
            ["--pick", "latency_ms<1"],
            "error: --pick 'latency_ms<1': no trial of the Pareto front (3 trials) satisfies "
            "latency_ms<1; seen latency_ms 2, 8, 16; loosen the constraint",
        ),
        (
            ["--pick", "latncy_ms<5"],
            "error: --pick: unknown metric 'latncy_ms' in 'latncy_ms<5'; expected an objective "
            "(val_accuracy, latency_ms) or a metric the trials recorded (val_loss)",
        ),
        (
            ["--pick", "latency_ms=5"],
            "error: --pick: expected METRIC<NUMBER (operators <, <=, >, >=; several "
            "comma-separated, e.g. 'latency_ms<5,val_loss<=0.3'), got 'latency_ms=5'",
        ),
        (
            ["--pick", "latency_ms<5", "--pareto"],
            "error: --pareto and --pick: give one (--pareto exports every point)",
        ),
    ],
)
def test_a_bad_pick_is_one_line_and_exit_2(tmp_path: Path, args: list[str], stderr: str) -> None:
    spec, _ = built_study(tmp_path, POINTS)
    proc = _cli("export", "mo", "--storage", spec.storage, "--out", str(tmp_path / "out"), *args)
    assert (proc.returncode, proc.stderr) == (2, stderr + "\n")
    assert not (tmp_path / "out").exists()


def test_pick_refuses_a_study_without_complete_trials(tmp_path: Path) -> None:
    spec, study = built_study(tmp_path, [])
    with pytest.raises(ExportError, match="has no COMPLETE trial to export"):
        pick_trial(study, spec, "latency_ms<5")


@pytest.mark.ray
def test_pick_exports_the_chosen_point_as_a_plain_export(
    searched: tuple[Any, Any], tmp_path: Path
) -> None:
    spec, study = searched
    front = pareto_trials(study)
    slowest = max(t.values[1] for t in front)  # the front's most accurate point is its slowest
    fits = [t for t in front if t.values[1] < slowest]
    expected = max(fits, key=lambda t: t.values[0]).number
    lines: list[str] = []
    result = export_study(
        "mo",
        spec.storage,
        tmp_path / "e",
        seeds=1,
        results_dir=tmp_path,
        pick=f"latency_ms<{slowest}",
        log=lines.append,
    )
    assert result.chosen.source_trial == expected and len(result.rows) == 1
    assert lines[0].startswith("importing trainable search.testing:curve")  # the stored spec's
    assert lines[1].startswith(f"--pick 'latency_ms<{slowest}': trial {expected} (")
    saved = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert saved["chosen"]["source_trial"] == expected
    assert saved["objectives"] == TWO
    assert {p.name for p in (tmp_path / "e").iterdir()} >= BUNDLE
    card = attached(study)[study.trials[expected]._trial_id]["MODEL_CARD.md"]
    stored = tmp_path / "mo" / "artifacts" / card
    assert stored.read_text() == (tmp_path / "e" / "MODEL_CARD.md").read_text()


@pytest.mark.ray
def test_plain_export_of_a_multi_objective_study_takes_the_fronts_best_and_says_so(
    searched: tuple[Any, Any], tmp_path: Path
) -> None:
    spec, study = searched
    best = max(pareto_trials(study), key=lambda t: t.values[0]).number
    lines: list[str] = []
    result = export_study(
        "mo", spec.storage, tmp_path / "e", top_k=1, seeds=1, results_dir=tmp_path, log=lines.append
    )
    assert result.chosen.source_trial == best
    assert lines[0].startswith("importing trainable search.testing:curve")
    assert lines[1] == (
        "study 'mo' has 2 objectives (val_accuracy, latency_ms): exporting the Pareto front's "
        "best on val_accuracy; --pareto exports every point of the front, --pick "
        "'latency_ms<...' chooses one by a constraint"
    )
