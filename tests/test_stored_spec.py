"""The spec a study holds, read back typed by one reader (:func:`search.record.study.stored_spec`):
the report takes its objective, budget and ASHA's settings from it, and reading it to show a
study imports none of the code it names."""

from __future__ import annotations

import sys
from pathlib import Path

import optuna
import pytest

from search.errors import SpecError
from search.record.study import NoSpecError, stored_spec
from search.report.figures import metric_of, milestones
from search.report.html import summarize
from search.specs.derive import asha_milestones
from search.specs.schema import AshaSpec, parse_spec
from tests.helpers import base_spec


def _study(tmp_path: Path, **changes: object) -> optuna.Study:
    tmp_path.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(study_name="t", storage=f"sqlite:///{tmp_path}/o.db")
    spec = parse_spec(base_spec(tmp_path, **changes)).to_dict()
    study.set_user_attr("spec", spec)
    return study


def test_the_stored_spec_is_read_back_typed(tmp_path: Path) -> None:
    study = _study(tmp_path, budget={"trials": 4, "max_epochs": 9}, asha={"grace_period": 2})
    spec = stored_spec(study)
    assert spec is not None and spec.budget.max_epochs == 9 and spec.asha.grace_period == 2
    assert stored_spec(optuna.create_study()) is None  # not made by search run
    study.set_user_attr("spec", {"study": "t"})
    with pytest.raises(SpecError, match="study 't': spec"):
        stored_spec(study)


def test_the_report_reads_asha_and_the_budget_from_the_spec(tmp_path: Path) -> None:
    study = _study(tmp_path, budget={"trials": 4, "max_epochs": 9}, asha={"grace_period": 2})
    defaults = AshaSpec()
    assert milestones(study) == asha_milestones(2.0, defaults.reduction_factor, 9)
    assert summarize(study).max_epochs == 9
    assert milestones(_study(tmp_path / "off", asha={"enabled": False})) == []


def test_the_report_names_the_first_objective_of_several(tmp_path: Path) -> None:
    """The primary objective names the axis, whether the spec holds one objective or a list."""
    objectives = [{"metric": "val_loss", "mode": "min"}, {"metric": "latency", "mode": "min"}]
    study = _study(tmp_path, objective=objectives, sampler={"name": "random", "seed": 0})
    assert metric_of(study) == "val_loss"


def test_reading_a_stored_spec_imports_none_of_its_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spec in the storage names a trainable whose package runs code on import: showing the
    study (the report, the dashboard's note) must not import it; export, which will run that
    code anyway, checks that it can be found."""
    package = tmp_path / "planted"
    (package / "sub").mkdir(parents=True)
    marker = tmp_path / "imported"
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (package / "sub" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    study = _study(tmp_path)
    study.set_user_attr("spec", {**study.user_attrs["spec"], "trainable": "planted.sub.m:fn"})
    spec = stored_spec(study)
    assert spec is not None and spec.trainable == "planted.sub.m:fn"
    assert metric_of(study) == "val_accuracy"
    assert not marker.exists()
    with pytest.raises(SpecError, match="cannot be imported"):
        stored_spec(study, find_code=True)  # looking the module up imports its parents
    assert marker.exists()
    sys.modules.pop("planted.sub", None)
    sys.modules.pop("planted", None)


def test_one_reader_of_the_stored_spec_for_export_and_the_report(tmp_path: Path) -> None:
    """``export`` and ``register`` read the spec through the same function as the report, and
    a study without one (not made by ``search run``) is their one line, not ``None``."""
    import search.handover.candidates

    assert not hasattr(search.handover.candidates, "stored_spec")  # no second reader
    study = _study(tmp_path)
    spec = stored_spec(study, "sqlite:///real.db", find_code=True, required=True)
    assert spec.storage == "sqlite:///real.db" and spec == stored_spec(study, "sqlite:///real.db")
    bare = optuna.create_study(study_name="bare")
    with pytest.raises(NoSpecError, match="study 'bare' has no spec .* run it again"):
        stored_spec(bare, required=True)
