"""A batch of trial writes stores what Optuna's own writes, one by one, would store, and
refuses, whole, what Optuna would refuse: on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from search.record.batch import Write, write_together
from search.record.storage import open_storage, rdb_backend
from tests.helpers import Postgres

LR = FloatDistribution(1e-4, 1e-1, log=True)
BATCH = CategoricalDistribution([32, 64])
LAYERS = IntDistribution(1, 4)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def urls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """Makes a fresh storage URL per name: a SQLite file, or a database on the server."""
    if request.param == "sqlite":
        yield lambda name: f"sqlite:///{tmp_path}/{name}.db"
        return
    server: Postgres = request.getfixturevalue("postgres")
    admin = sqlalchemy.create_engine(
        server.url(server.password).replace("postgresql://", "postgresql+psycopg://"),
        isolation_level="AUTOCOMMIT",
    )
    made: list[str] = []

    def fresh(name: str) -> str:
        database = f"{name}_{len(made)}_{tmp_path.name[-8:]}".lower().replace("-", "_")
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f'CREATE DATABASE "{database}"'))
        made.append(database)
        return server.url(server.password).rsplit("/", 1)[0] + f"/{database}"

    yield fresh
    admin.dispose()


def _study(url: str) -> optuna.Study:
    sampler = optuna.samplers.RandomSampler(seed=0)
    return optuna.create_study(study_name="b", storage=open_storage(url), sampler=sampler)


def _writes(trials: list[int]) -> list[Write]:
    """What a trial's life queues: parameters (one set twice), attributes (one overwritten),
    a system attribute, and epochs, among them NaN, infinities and a step written twice."""
    writes: list[Write] = []
    for i, t in enumerate(trials):
        writes += [
            (t, "set_trial_param", ("lr", LR.to_internal_repr(0.01 * (i + 1)), LR)),
            (t, "set_trial_param", ("batch", BATCH.to_internal_repr(64), BATCH)),
            (t, "set_trial_param", ("batch", BATCH.to_internal_repr(32), BATCH)),  # kept: 64
            (t, "set_trial_param", ("layers", LAYERS.to_internal_repr(i + 1), LAYERS)),
            (t, "set_trial_user_attr", ("ray_trial_id", f"r{i}")),
            (t, "set_trial_user_attr", ("metrics", {"loss": [0.5, 0.25], "epoch": 2})),
            (t, "set_trial_user_attr", ("ray_trial_id", f"again{i}")),
            (t, "set_trial_system_attr", ("fate", {"state": "PRUNED", "values": None})),
        ]
        for step, value in enumerate([0.5, math.nan, math.inf, -math.inf, 0.75]):
            writes.append((t, "set_trial_intermediate_value", (step, value)))
        writes.append((t, "set_trial_intermediate_value", (4, 0.875)))
    return writes


def _again(trials: list[int]) -> list[Write]:
    """A later batch setting a stored parameter again: Optuna keeps the first value."""
    return [(t, "set_trial_param", ("batch", BATCH.to_internal_repr(32), BATCH)) for t in trials]


def _stored(url: str) -> list[tuple[Any, ...]]:
    return [
        (
            t.number,
            t.state,
            t.params,
            t.distributions,
            t.user_attrs,
            t.system_attrs,
            {step: str(value) for step, value in t.intermediate_values.items()},  # NaN == NaN
        )
        for t in optuna.load_study(study_name="b", storage=url).trials
    ]


def test_a_batch_stores_what_optunas_writes_one_by_one_store(urls: Callable[[str], str]) -> None:
    together, alone = urls("together"), urls("alone")
    stores = {url: _study(url) for url in (together, alone)}
    for study in stores.values():
        first = study.ask()
        first.suggest_float("lr", 1e-4, 1e-1, log=True)  # the study knows lr already
        study.tell(first, 1.0)
        for _ in range(3):
            study.ask()
    mine = [t._trial_id for t in stores[together].trials[1:]]
    theirs = [t._trial_id for t in stores[alone].trials[1:]]
    assert write_together(stores[together]._storage, _writes(mine)) is True
    assert write_together(stores[together]._storage, _again(mine)) is True  # stored: kept
    storage = stores[alone]._storage
    for trial_id, method, args in _writes(theirs) + _again(theirs):
        getattr(storage, method)(trial_id, *args)
    assert _stored(together) == _stored(alone)
    assert _stored(together)[3][2] == {"lr": pytest.approx(0.03), "batch": 64, "layers": 3}


def _refused(trial: int, peer: int, finished: int) -> dict[str, list[Write]]:
    """Batches that each hold one write Optuna refuses, after a good one."""
    good = (trial, "set_trial_user_attr", ("good", 1))
    return {
        "a finished trial": [good, (finished, "set_trial_user_attr", ("late", 1))],
        "a missing trial": [good, (10_000, "set_trial_intermediate_value", (1, 0.5))],
        "a clash with the study": [
            good,
            (trial, "set_trial_param", ("lr", 0, CategoricalDistribution(["a", "b"]))),
        ],
        "a clash within the batch": [
            good,
            (trial, "set_trial_param", ("width", 0.5, FloatDistribution(0, 1))),
            (peer, "set_trial_param", ("width", 0, CategoricalDistribution(["a"]))),
        ],
        "a value that is not JSON": [good, (trial, "set_trial_user_attr", ("x", object()))],
    }


def test_a_batch_with_a_write_optuna_refuses_fails_whole(urls: Callable[[str], str]) -> None:
    study = _study(urls("refused"))
    done = study.ask()
    done.suggest_float("lr", 1e-4, 1e-1, log=True)
    study.tell(done, 1.0)
    finished = study.ask()
    study.tell(finished, state=TrialState.FAIL)
    storage = study._storage
    for why, writes in _refused(-1, -2, finished._trial_id).items():
        trial, peer = study.ask()._trial_id, study.ask()._trial_id
        writes = [(trial if t == -1 else peer if t == -2 else t, m, a) for t, m, a in writes]
        with pytest.raises(Exception):  # noqa: B017 (whatever Optuna itself would raise)
            write_together(storage, writes)
        for trial_id in (trial, peer):  # nothing of the batch was stored
            stored = storage.get_trial(trial_id)
            assert (stored.user_attrs, stored.params) == ({}, {}), why
        with pytest.raises(Exception):  # noqa: B017 (Optuna refuses one of them too)
            for trial_id, method, args in writes:
                getattr(storage, method)(trial_id, *args)


def test_each_parameters_distribution_is_read_once_per_writer(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/known.db"
    study = _study(url)
    trials = [study.ask()._trial_id for _ in range(2)]
    engine = rdb_backend(study._storage).engine
    reads: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "trial_params" in statement:
            reads.append(statement)

    sqlalchemy.event.listen(engine, "before_cursor_execute", count)
    known: dict = {}
    assert write_together(study._storage, _writes(trials[:1]), known)
    assert len(reads) == 3  # one per parameter name, the first time
    assert write_together(study._storage, _writes(trials[1:]), known)
    assert len(reads) == 3  # none: their distributions are known
    assert set(known) == {(study._study_id, name) for name in ("lr", "batch", "layers")}
