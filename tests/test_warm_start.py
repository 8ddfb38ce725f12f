"""A good start and a pinned sampler: ``sampler.start_from`` runs first, ``warm_start`` teaches
the sampler an earlier study, and the sampler's every argument is stored on the study, so a
resume samples as the first run did."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from search.errors import SpecError
from search.record.resume import IMPORTED, recover
from search.record.study import SAMPLER, open_study, record_spec
from search.record.warm import START_FROM, WARM_START, import_trials
from search.specs.pinned import PINNED
from search.specs.schema import parse_spec
from tests.helpers import base_spec, run_spec, write_spec

pytestmark = pytest.mark.slow  # over 5 s here: make test-fast leaves it out

FAIL = TrialState.FAIL


def _spec(tmp_path: Path, **changes: object) -> dict:
    return base_spec(tmp_path, **{"sampler": {"name": "tpe", "seed": 0}, **changes})


def test_the_study_stores_every_pinned_argument_and_a_resume_keeps_them(tmp_path: Path) -> None:
    spec = parse_spec(_spec(tmp_path))
    study = open_study(spec)
    record_spec(study, spec)
    stored = study.user_attrs[SAMPLER]
    assert stored["name"] == "tpe" and stored["optuna"] == optuna.__version__
    assert stored["args"] == PINNED["tpe"]
    assert study.sampler._n_startup_trials == PINNED["tpe"]["n_startup_trials"]

    # A study first run by another version, that pinned another startup: a resume keeps it.
    study.set_user_attr(SAMPLER, {**stored, "args": {**stored["args"], "n_startup_trials": 3}})
    resumed = open_study(spec)
    assert resumed.sampler._n_startup_trials == 3
    # ... unless the spec says otherwise, and then the study records what it now runs.
    spec5 = parse_spec(_spec(tmp_path, sampler={"name": "tpe", "args": {"n_startup_trials": 5}}))
    again = open_study(spec5)
    record_spec(again, spec5)
    assert again.sampler._n_startup_trials == 5
    assert again.user_attrs[SAMPLER]["args"]["n_startup_trials"] == 5


@pytest.mark.parametrize(
    ("sampler", "message"),
    [
        ({"name": "tpe", "args": {"n_startup": 3}}, "sampler.args.n_startup: not an argument"),
        ({"name": "tpe", "args": {"multivariate": 1}}, "args.multivariate: expected a bool"),
        ({"name": "random", "args": {"n_startup_trials": 3}}, "the random sampler takes"),
        ({"name": "tpe", "start_from": [{"x": 2.0}]}, "sampler.start_from.0.x: expected a value"),
        ({"name": "tpe", "start_from": [{"y": 0.5}]}, "sampler.start_from.0.y: not a parameter"),
    ],
)
def test_bad_sampler_arguments_and_start_configs_get_one_line(
    tmp_path: Path, sampler: dict, message: str
) -> None:
    with pytest.raises(SpecError, match=message.replace(".", r"\.")):
        parse_spec(_spec(tmp_path, sampler=sampler), source="s.yaml")


def _earlier(tmp_path: Path, direction: str = "maximize") -> optuna.Study:
    """A study of 5 COMPLETE trials on the space ``x`` in [0, 1] (value x, at epoch 1 x / 2),
    one FAIL, and one COMPLETE at x = 1.5, outside the new space."""
    study = optuna.create_study(
        study_name="old", storage=f"sqlite:///{tmp_path}/old.db", direction=direction
    )
    unit, wide = FloatDistribution(0.0, 1.0), FloatDistribution(0.0, 2.0)
    for x in (0.1, 0.3, 0.5, 0.7, 0.9):
        study.add_trial(
            create_trial(params={"x": x}, distributions={"x": unit}, value=x,
                         intermediate_values={1: x / 2})
        )  # fmt: skip
    study.add_trial(create_trial(params={"x": 0.2}, distributions={"x": unit}, state=FAIL))
    study.add_trial(create_trial(params={"x": 1.5}, distributions={"x": wide}, value=1.5))
    return study


def test_warm_start_copies_the_fitting_complete_trials_marked_and_uncounted(
    tmp_path: Path,
) -> None:
    _earlier(tmp_path)
    data = _spec(tmp_path, warm_start={"study": "old", "storage": f"sqlite:///{tmp_path}/old.db"})
    spec = parse_spec(data)
    study = open_study(spec)
    imported = import_trials(study, spec)
    expected = [f"old#{n}" for n in range(5)]  # not the FAIL, nor x = 1.5
    assert imported == expected
    assert study.user_attrs[WARM_START] == {"study": "old", "trials": expected}
    copies = study.get_trials(deepcopy=False)
    assert [t.user_attrs[IMPORTED] for t in copies] == expected
    assert all(t.state == TrialState.COMPLETE for t in copies)
    assert copies[2].params == {"x": 0.5} and copies[2].intermediate_values == {1: 0.25}
    assert recover(study).counted == 0  # not run here: no part of the budget
    assert import_trials(study, spec) == []  # once, on a new study


def test_a_warm_start_from_a_missing_or_opposite_study_stops_in_one_line(tmp_path: Path) -> None:
    _earlier(tmp_path, direction="minimize")
    url = f"sqlite:///{tmp_path}/old.db"
    for warm, message in [
        ({"study": "nope", "storage": url}, "warm_start.study: 'nope' is not in"),
        ({"study": "old", "storage": url}, "'old' optimizes minimize, this spec maximize"),
    ]:
        spec = write_spec(tmp_path / "s.yaml", _spec(tmp_path, warm_start=warm))
        done = run_spec(spec)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], done.stderr
        assert "t" not in optuna.get_all_study_names(f"sqlite:///{tmp_path}/optuna.db")


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.usefixtures("joins_session_ray")
def test_a_run_starts_from_the_trusted_configs_after_learning_the_earlier_study(
    tmp_path: Path,
) -> None:
    _earlier(tmp_path)
    data = _spec(
        tmp_path,
        budget={"trials": 4, "max_epochs": 2},
        asha={"enabled": False},
        warm_start={"study": "old", "storage": f"sqlite:///{tmp_path}/old.db"},
    )
    data["sampler"]["start_from"] = [{"x": 0.25}, {"x": 0.75}]
    spec = write_spec(tmp_path / "s.yaml", data)
    done = run_spec(spec)
    assert done.returncode == 0, done.stdout + done.stderr
    study = optuna.load_study(study_name="t", storage=data["storage"])
    imported = [t for t in study.trials if IMPORTED in t.user_attrs]
    ran = [t for t in study.trials if IMPORTED not in t.user_attrs]
    assert len(imported) >= 5
    assert len(ran) == 4  # the whole budget ran here: the imported trials are extra
    assert [t.params["x"] for t in ran[:2]] == [0.25, 0.75]
    assert [t.user_attrs.get(START_FROM) for t in ran] == [0, 1, None, None]
    assert all(t.state == TrialState.COMPLETE for t in ran)
    assert all(len(t.intermediate_values) == 2 for t in ran)
    assert f"({len(imported)} of them imported by warm_start)" in done.stdout
