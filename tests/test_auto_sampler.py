"""``sampler: {name: auto}``: the plan for K trials at once, the space-filling start, the
distinct proposals, and one trial at a time exactly as the pinned TPE."""

from __future__ import annotations

import statistics
from pathlib import Path

import optuna
import pytest

from search.record.sampling.auto import AutoSampler, Plan, plan_for
from search.record.sampling.distinct import DistinctTPESampler
from search.record.sampling.samplers import SAMPLER, build_sampler, configure
from search.record.study import open_study, record_spec
from search.specs.pinned import PINNED
from search.specs.schema import parse_spec
from search.specs.space import Param, sample
from tests.helpers import base_spec

SPACE = {
    "lr": {"loguniform": [1e-4, 1e-1]},
    "dropout": {"uniform": [0.0, 0.5]},
    "layers": {"int": [1, 4]},
    "optimizer": {"choice": ["sgd", "adam"]},
    "momentum": {"uniform": [0.8, 0.99], "when": {"optimizer": "sgd"}},
}


def _spec(tmp_path: Path, **changes: object) -> object:
    data = base_spec(tmp_path, sampler={"name": "auto", "seed": 3}, space=SPACE)
    data["objective"] = {"metric": "loss", "mode": "min"}
    return parse_spec({**data, **changes})


def _loss(params: dict) -> float:
    return (params["dropout"] - 0.2) ** 2 + params["layers"] + (params["optimizer"] == "sgd")


def _fields(plan: Plan) -> tuple:
    return (plan.start, plan.spacefill, plan.multivariate, plan.constant_liar, plan.distinct)


def test_the_plan_follows_the_concurrency() -> None:
    """One at a time: the pinned TPE; a few at once: no liar, distinct, a Thompson pick;
    many at once: univariate too, after a space-filling first batch."""
    assert _fields(plan_for(1)) == (10, False, True, True, False) and not plan_for(1).thompson
    assert _fields(plan_for(4)) == (10, False, True, False, True) and plan_for(4).thompson
    assert _fields(plan_for(16)) == (16, True, False, False, True) and plan_for(16).thompson
    assert plan_for(64).start == 64 and plan_for(8).spacefill and not plan_for(7).spacefill


def test_auto_is_the_default_sampler(tmp_path: Path) -> None:
    data = base_spec(tmp_path)
    del data["sampler"]
    assert parse_spec(data).sampler.name == "auto"


def test_one_at_a_time_it_proposes_as_the_pinned_tpe(tmp_path: Path) -> None:
    """K = 1: the same configs, in order, as the project's TPE with the same seed."""
    spec = _spec(tmp_path)
    tpe = parse_spec({**spec.to_dict(), "sampler": {"name": "tpe", "seed": 3}})
    drawn = []
    for sampler in (build_sampler(spec), build_sampler(tpe)):
        study = optuna.create_study(sampler=sampler)
        for _ in range(16):
            trial = study.ask()
            study.tell(trial, _loss(sample(trial, spec.space)))
        drawn.append([t.params for t in study.trials])
    assert drawn[0] == drawn[1]


def test_many_at_once_the_first_batch_fills_the_space(tmp_path: Path) -> None:
    """K = 16: the 16 configs asked before any result put one dropout in each sixteenth of
    its range and 8 of each optimizer (16 random draws rarely do: about 1 in 10**6)."""
    sampler = build_sampler(_spec(tmp_path))
    assert isinstance(sampler, AutoSampler)
    sampler.configure(16)
    study = optuna.create_study(sampler=sampler)
    params = [sample(study.ask(), _spec(tmp_path).space) for _ in range(16)]
    assert sorted(int(p["dropout"] / (0.5 / 16)) for p in params) == list(range(16))
    assert sum(p["optimizer"] == "sgd" for p in params) == 8


def _proposals(sampler: optuna.samplers.BaseSampler, space: dict, running: int) -> list:
    """Two trials told (the model's start), then ``running`` asked on that model, none told."""
    spec_space = {n: Param.model_validate(p) for n, p in space.items()}
    study = optuna.create_study(sampler=sampler)
    for value in (1.0, 0.0):
        trial = study.ask()
        sample(trial, spec_space)
        study.tell(trial, value)
    for _ in range(running):
        sample(study.ask(), spec_space)
    return [t.params for t in study.trials[2:]]


def test_no_config_is_proposed_twice_while_a_fresh_one_is_left() -> None:
    """On a space of 12 configs, 10 proposals on one model while the earlier ones run: all
    differ from each other and from the two told (TPE without the liar repeats its best)."""
    space = {"a": {"int": [0, 3]}, "b": {"choice": ["x", "y", "z"]}}
    args = {"n_startup_trials": 2, "constant_liar": False, "n_ei_candidates": 64}
    ours = _proposals(DistinctTPESampler(seed=0, **args), space, 10)
    assert len({(p["a"], p["b"]) for p in ours}) == 10
    plain = _proposals(optuna.samplers.TPESampler(seed=0, **args), space, 10)
    assert len({(p["a"], p["b"]) for p in plain}) < 10


def test_univariate_it_skips_the_values_a_parameter_already_has() -> None:
    """At K >= 8 (univariate TPE) the check sees one parameter at a time: while a fresh value
    of ``a`` is left, no proposal repeats one that a trial of the study has, even where its
    whole config would be new (docs/search-quality.md says so)."""
    space = {"a": {"int": [0, 11]}, "b": {"choice": ["x", "y", "z"]}}
    args = {"n_startup_trials": 2, "constant_liar": False, "multivariate": False}
    sampler = DistinctTPESampler(seed=0, n_ei_candidates=64, **args)
    spec_space = {n: Param.model_validate(p) for n, p in space.items()}
    study = optuna.create_study(sampler=sampler)
    for value in (1.0, 0.0):
        trial = study.ask()
        sample(trial, spec_space)
        study.tell(trial, value)
    held = {t.params["a"] for t in study.trials}
    for _ in range(12 - len(held)):
        sample(study.ask(), spec_space)
    assert sorted(t.params["a"] for t in study.trials) == list(range(12))
    plain = _proposals(optuna.samplers.TPESampler(seed=0, n_ei_candidates=64, **args), space, 10)
    assert len({p["a"] for p in plain}) < 10  # TPE alone repeats its best value


def test_a_thompson_pick_spreads_proposals_made_on_one_model() -> None:
    """20 proposals on the same model (none told): drawn in proportion to TPE's density
    ratio they spread wider than TPE's largest-ratio picks."""
    space = {"x": {"uniform": [0.0, 1.0]}}
    args = {"n_startup_trials": 2, "constant_liar": False}
    spread = {}
    for thompson in (False, True):
        sampler = DistinctTPESampler(seed=1, thompson=thompson, **args)
        spread[thompson] = statistics.pstdev(p["x"] for p in _proposals(sampler, space, 20))
    assert spread[True] > 1.5 * spread[False], spread


def test_the_study_records_the_plan_it_ran(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    study = open_study(spec)
    record_spec(study, spec)
    configure(study, 16)
    recorded = study.user_attrs[SAMPLER]
    assert recorded["name"] == "auto" and recorded["args"] == PINNED["auto"]
    assert recorded["plan"] == {
        "concurrency": 16,
        "start": 16,
        "spacefill": True,
        "multivariate": False,
        "constant_liar": False,
        "distinct": True,
        "thompson": True,
    }


@pytest.mark.parametrize("name", ["tpe", "random"])
def test_a_named_sampler_keeps_its_arguments(tmp_path: Path, name: str) -> None:
    """A spec that names its sampler is built as before, whatever the concurrency."""
    spec = _spec(tmp_path, sampler={"name": name, "seed": 0})
    study = open_study(spec)
    record_spec(study, spec)
    configure(study, 16)
    assert "plan" not in study.user_attrs[SAMPLER]
    assert not isinstance(study.sampler, AutoSampler)
