"""A study's storage is data, not commands: whoever can write it chooses study names and the
spec stored there. A name that would leave ``--results`` is refused in one line before a file
is written; ``export`` and ``train`` say which code they import before they import it."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial
from typer.testing import CliRunner

from search.cli import app
from tests.helpers import base_spec, write_spec

ESCAPE = "../../escape"


def _study(url: str, name: str, spec: bool = False) -> optuna.Study:
    """A study named ``name`` with two COMPLETE trials (and a stored spec)."""
    study = optuna.create_study(study_name=name, storage=url, direction="maximize")
    for x in (0.2, 0.7):
        study.add_trial(
            create_trial(value=x, params={"x": x}, distributions={"x": FloatDistribution(0, 1)})
        )
    if spec:
        stored = base_spec(Path("/unused"), data={"loader": "pkg.data:load"})
        study.set_user_attr("spec", {**stored, "study": "t"})
    return study


def _errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


def test_report_refuses_a_study_name_from_the_storage_that_would_leave_results(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    _study(url, ESCAPE)
    results = tmp_path / "a" / "b" / "results"
    result = CliRunner().invoke(app, ["report", ESCAPE, "--storage", url, "--results", results])
    assert result.exit_code == 2, result.output
    (line,) = _errors(result.output)
    assert line.startswith(f"error: study name '{ESCAPE}' (as the storage holds it) would put")
    assert not [p for p in tmp_path.rglob("*") if p.suffix in (".html", ".png")]


def test_every_folder_of_a_study_is_refused_for_such_a_name(tmp_path: Path) -> None:
    """The artifact store, the confirmation storage and the dashboard's pass over every study
    build the folder in the one place that refuses it; the dashboard skips the study."""
    from search.errors import SearchError
    from search.record.artifacts import store_path
    from search.record.study import confirm_storage
    from search.report.dashboard import publish_all

    url = f"sqlite:///{tmp_path}/s.db"
    _study(url, ESCAPE)
    results = tmp_path / "a" / "b" / "results"
    (tmp_path / "a" / "escape").mkdir(parents=True)  # the folder the name reaches
    for name in (ESCAPE, "..", "a/b", "x\\y"):
        with pytest.raises(SearchError, match="would put files outside --results"):
            store_path(results, name)
        with pytest.raises(SearchError):
            confirm_storage(results, name)
    assert publish_all(url, results) == {}
    assert not list((tmp_path / "a" / "escape").iterdir())


def test_export_refuses_such_a_name_before_it_imports_anything(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    _study(url, ESCAPE, spec=True)
    result = CliRunner().invoke(
        app, ["export", ESCAPE, "--storage", url, "--results", tmp_path / "a" / "b" / "r"]
    )
    assert result.exit_code == 2, result.output
    assert "importing trainable" not in result.output
    (line,) = _errors(result.output)
    assert "would put files outside --results" in line


def test_export_names_the_trainable_and_loader_of_the_stored_spec_before_it_imports_them(
    tmp_path: Path,
) -> None:
    """The stored spec names a loader that does not exist: the line comes first, then the
    import fails in one line."""
    url = f"sqlite:///{tmp_path}/s.db"
    _study(url, "plain", spec=True)
    result = CliRunner().invoke(
        app, ["export", "plain", "--storage", url, "--results", tmp_path / "r", "--seeds", "1"]
    )
    said = (
        "importing trainable search.testing:curve and data loader pkg.data:load, "
        "as the spec stored in study 'plain' names them"
    )
    lines = result.output.splitlines()
    assert said in lines, result.output
    assert result.exit_code != 0 and _errors(result.output), result.output
    assert lines.index(said) < lines.index(_errors(result.output)[0])


def test_train_names_the_trainable_and_loader_before_it_imports_them(tmp_path: Path) -> None:
    data = base_spec(tmp_path, budget={"trials": 1, "max_epochs": 1}, space={}, fixed={"x": 0.5})
    spec = write_spec(tmp_path / "config.yaml", data)
    result = CliRunner().invoke(app, ["train", str(spec)])
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first == (f"importing trainable search.testing:curve and no data, as {spec} names them")


def test_logs_prints_no_file_the_storage_names_but_a_trials_output(tmp_path: Path) -> None:
    """``user_attrs.log`` is a trial attribute anyone who writes the storage can set: a file
    that is not a trial's ``output.log`` is never printed."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the-secret\n")
    url = f"sqlite:///{tmp_path}/s.db"
    study = _study(url, "plain")
    study.add_trial(create_trial(value=0.5, user_attrs={"log": str(secret)}))
    result = CliRunner().invoke(app, ["logs", "plain", "2", "--storage", url])
    assert result.exit_code == 2, result.output
    assert "the-secret" not in result.output
    (line,) = _errors(result.output)
    assert "not a trial's output.log" in line


def test_an_artifact_id_from_the_storage_never_becomes_a_path(tmp_path: Path) -> None:
    import json

    from search.record.artifacts import attached

    url = f"sqlite:///{tmp_path}/s.db"
    study = _study(url, "plain")
    for key, artifact_id in (("artifacts:a", "../../escape"), ("artifacts:b", "fine-id")):
        meta = {"artifact_id": artifact_id, "filename": key[-1] + ".png"}
        study._storage.set_study_system_attr(study._study_id, key, json.dumps(meta))
    assert attached(study)[None] == {"b.png": "fine-id"}
