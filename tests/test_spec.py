"""The spec validator: good specs parse, every bad one gives one line naming file and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from search.errors import SpecError
from search.specs.schema import load_spec, parse_spec, with_overrides
from tests.helpers import REPO, base_spec, write_spec


def test_shipped_cnn_space_parses() -> None:
    spec = load_spec(REPO / "spaces" / "cnn.yaml")
    assert spec.study == "cnn-digits"
    assert spec.storage == "sqlite:///results/optuna.db"
    assert spec.space["momentum"].when == {"optimizer": "sgd"}


@pytest.mark.parametrize(
    ("param", "kind"),
    [
        ({"uniform": [0.0, 1.0]}, "uniform"),
        ({"loguniform": [1e-5, 1e-1]}, "loguniform"),
        ({"int": [1, 9], "step": 2}, "int"),
        ({"int": [1, 64], "log": True}, "int"),
        ({"choice": ["a", "b"]}, "choice"),
        ({"fixed": 3}, "fixed"),
    ],
)
def test_each_distribution_parses(tmp_path: Path, param: dict[str, Any], kind: str) -> None:
    spec = parse_spec(base_spec(tmp_path, space={"p": param}))
    assert spec.space["p"].kind == kind
    assert parse_spec(spec.to_dict()) == spec  # round-trips through YAML-ready data


@pytest.mark.parametrize(
    "changes",
    [
        {"resources": {"fuse": "off"}},  # off is None, the default auto
        {"sampler": {"name": "tpe", "seed": None}},  # unseeded, the default seed 0
        {"resources": {"fuse": 4, "gpus_per_trial": "auto"}},
    ],
)
def test_a_none_that_differs_from_its_default_round_trips(
    tmp_path: Path, changes: dict[str, Any]
) -> None:
    spec = parse_spec(base_spec(tmp_path, **changes))
    again = parse_spec(spec.to_dict())  # as a retrain, a resume and `derive` re-read it
    assert again == spec
    assert again.resources.fuse == spec.resources.fuse and again.sampler.seed == spec.sampler.seed


def _bad(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    return base_spec(tmp_path, **changes)


BAD: list[tuple[str, Any, str, str]] = [
    # (case, change to the spec, field named in the error, words expected in it)
    ("unknown top-level key", {"budgett": {}}, "budgett", "unknown key"),
    ("unknown nested key", {"budget": {"trials": 2, "epochs": 3}}, "budget.epochs", "unknown key"),
    ("low above high", {"space": {"lr": {"loguniform": [0.1, 1e-4]}}}, "space.lr", "below high"),
    ("loguniform at zero", {"space": {"lr": {"loguniform": [0, 1]}}}, "space.lr", "above 0"),
    ("unknown trainable", {"trainable": "torch_cnnn"}, "trainable", "unknown trainable"),
    ("unimportable module", {"trainable": "nope.mod:fn"}, "trainable", "cannot be imported"),
    ("unknown distribution", {"space": {"lr": {"gauss": [0, 1]}}}, "space.lr.gauss", "unknown"),
    (
        "two distributions",
        {"space": {"lr": {"uniform": [0, 1], "choice": [1]}}},
        "space.lr",
        "exactly one",
    ),
    (
        "when names a missing parameter",
        {"space": {"m": {"uniform": [0, 1], "when": {"opt": "sgd"}}}},
        "space",
        "not in space",
    ),
    (
        "when value never possible",
        {"space": {"opt": {"choice": ["adam"]}, "m": {"uniform": [0, 1], "when": {"opt": "sgd"}}}},
        "space",
        "can never be",
    ),
    (
        "cyclic conditions",
        {"space": {"a": {"choice": [1], "when": {"b": 1}}, "b": {"choice": [1], "when": {"a": 1}}}},
        "space",
        "cycle",
    ),
    ("bad mode", {"objective": {"metric": "m", "mode": "maximize"}}, "objective.mode", "maximize"),
    ("zero trials", {"budget": {"trials": 0}}, "budget.trials", "got 0"),
    ("reduction factor 1", {"asha": {"reduction_factor": 1}}, "asha.reduction_factor", "got 1"),
    ("grace above budget", {"asha": {"grace_period": 9}}, "asha.grace_period", "got 9"),
    ("fixed and searched", {"fixed": {"x": 1}}, "space.x", "also given in fixed"),
]


@pytest.mark.parametrize(("case", "change", "field", "words"), BAD, ids=[b[0] for b in BAD])
def test_bad_spec_gives_one_clear_line(
    tmp_path: Path, case: str, change: dict[str, Any], field: str, words: str
) -> None:
    path = write_spec(tmp_path / "bad.yaml", _bad(tmp_path, **change))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert field in info.value.field
    assert words in message


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("study: x\nspace: {lr: [1, 2\n")
    with pytest.raises(SpecError, match=r"broken.yaml: YAML syntax error at line \d+"):
        load_spec(path)


def test_missing_file_and_non_mapping(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read file"):
        load_spec(tmp_path / "absent.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="expected a mapping"):
        load_spec(tmp_path / "list.yaml")


def test_unsafe_yaml_tags_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.yaml"
    path.write_text("study: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(SpecError, match="YAML syntax error"):
        load_spec(path)


def test_overrides_are_validated(tmp_path: Path) -> None:
    spec = parse_spec(base_spec(tmp_path))
    assert with_overrides(spec, **{"budget.trials": 7, "study": None}).budget.trials == 7
    with pytest.raises(SpecError, match="<cli>: budget.trials"):
        with_overrides(spec, **{"budget.trials": -1})
