"""Several trial writes in one database transaction, and SQLite commits that do not wait for
the disk.

Optuna's RDB storage commits each ``set_trial_param``, ``set_trial_user_attr``,
``set_trial_system_attr`` and ``set_trial_intermediate_value`` on its own: on SQLite that is
one transaction (and one lock of the database file) per write. The write-behind queue
(:mod:`search.record.writeback`) gathers the writes made while the previous ones were
committed; this module commits them together, one statement per table with many rows.

Optuna has no batch write, and its per-write code (an ORM query for the trial, then an upsert
compiled anew) costs driver CPU on every write, beside Tune's loop. So this writes
Optuna's tables directly, as :mod:`search.record.bulk` reads them, and makes Optuna's checks
itself, once a batch: every trial exists and is not finished, and each parameter's
distribution is compatible with the study's earlier ones. A write Optuna would refuse fails
the whole batch; the caller then writes one by one, through Optuna, to find it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import MutableMapping, Sequence
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    check_distribution_compatibility,
    distribution_to_json,
    json_to_distribution,
)
from optuna.storages import BaseStorage, RDBStorage

from search.record.storage import rdb_backend

Write = tuple[int, str, tuple[Any, ...]]
"""One queued write: ``(trial_id, storage method name, its arguments after trial_id)``."""

Known = MutableMapping[tuple[int, str], BaseDistribution]
"""(study id, parameter name) -> a distribution the study holds for it: a caller that writes
many batches passes one, so each name's distribution is read from the database once."""


def write_together(
    storage: BaseStorage, writes: Sequence[Write], known: Known | None = None
) -> bool:
    """Commits ``writes`` in one transaction; ``False`` (nothing written) when ``storage`` is
    not on SQLite or PostgreSQL, and raises (nothing written) when any write fails. A later
    write of one key (an attribute, an epoch's value) replaces an earlier one, as Optuna does.

    Example:
        >>> import optuna
        >>> write_together(optuna.storages.InMemoryStorage(), [(0, "set_trial_user_attr",
        ...                                                    ("k", 1))])
        False
    """
    backend = rdb_backend(storage)
    engine = getattr(backend, "engine", None)
    if not isinstance(backend, RDBStorage) or engine is None or not _has_upsert(engine):
        return False
    if not writes:
        return True
    from optuna.storages._rdb import models

    rows: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {}
    params: list[tuple[int, str, BaseDistribution]] = []
    for trial_id, method, args in writes:
        model, key, row = _row(models, trial_id, method, args)
        keyed = rows.setdefault(model, {})
        if method == "set_trial_param":  # Optuna keeps a parameter's first value,
            keyed.setdefault(key, row)
            params.append((trial_id, args[0], args[2]))
        else:  # an attribute's or an epoch's last
            keyed[key] = row
    known = {} if known is None else known
    with engine.begin() as conn:
        studies = _updatable(conn, models, {write[0] for write in writes})
        learnt = _check_params(conn, models, params, studies, known)
        for name, keyed in rows.items():
            conn.execute(_insert(engine, getattr(models, name).__table__), list(keyed.values()))
    known.update(learnt)  # only once committed
    return True


def _row(
    models: Any, trial_id: int, method: str, args: tuple[Any, ...]
) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """The Optuna model (and table) of one write, its unique key, and its row as Optuna
    stores it."""
    if method in ("set_trial_user_attr", "set_trial_system_attr"):
        key, value = args
        model = "TrialUserAttributeModel" if "user" in method else "TrialSystemAttributeModel"
        row = {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
        return model, (trial_id, key), row
    if method == "set_trial_intermediate_value":
        step, value = args
        stored, kind = models.TrialIntermediateValueModel.intermediate_value_to_stored_repr(value)
        row = {"trial_id": trial_id, "step": step, "intermediate_value": stored}
        row["intermediate_value_type"] = kind
        return "TrialIntermediateValueModel", (trial_id, step), row
    if method == "set_trial_param":
        name, internal, distribution = args
        row = {"trial_id": trial_id, "param_name": name, "param_value": internal}
        row["distribution_json"] = distribution_to_json(distribution)
        return "TrialParamModel", (trial_id, name), row
    raise ValueError(f"{method} is not a write this batch knows")


def _has_upsert(engine: Any) -> bool:
    name = engine.dialect.name
    return name == "postgresql" or (name == "sqlite" and sqlite3.sqlite_version_info >= (3, 24))


def _insert(engine: Any, table: Any) -> Any:
    """``INSERT ... ON CONFLICT`` on the table's unique key, as Optuna writes: ``DO UPDATE`` an
    attribute or an epoch's value, ``DO NOTHING`` for a parameter (it keeps the first)."""
    from sqlalchemy.dialects import postgresql, sqlite

    stmt = (sqlite if engine.dialect.name == "sqlite" else postgresql).insert(table)
    unique = ["trial_id", next(c for c in ("key", "step", "param_name") if c in table.c)]
    if unique[1] == "param_name":
        return stmt.on_conflict_do_nothing(index_elements=unique)
    changing = [c.name for c in table.c if c.name not in unique and not c.primary_key]
    return stmt.on_conflict_do_update(
        index_elements=unique, set_={name: stmt.excluded[name] for name in changing}
    )


def _updatable(conn: Any, models: Any, trial_ids: set[int]) -> dict[int, int]:
    """Each trial's study id; raises, as Optuna would, when a trial is missing or finished."""
    trials = models.TrialModel.__table__
    found = conn.execute(
        trials.select()
        .with_only_columns(trials.c.trial_id, trials.c.study_id, trials.c.state)
        .where(trials.c.trial_id.in_(sorted(trial_ids)))
    ).all()
    finished = sorted(trial_id for trial_id, _, state in found if state.is_finished())
    missing = sorted(trial_ids - {trial_id for trial_id, _, _ in found})
    if missing or finished:
        raise KeyError(f"trials missing {missing} or finished {finished}")
    return {trial_id: study_id for trial_id, study_id, _ in found}


def _check_params(
    conn: Any,
    models: Any,
    params: list[tuple[int, str, BaseDistribution]],
    studies: dict[int, int],
    known: Known,
) -> dict[tuple[int, str], BaseDistribution]:
    """Optuna's check of each parameter's distribution against an earlier one of its study
    (``known``, else the database's, else this batch's); returns what it learnt."""
    import sqlalchemy

    table, trials = models.TrialParamModel.__table__, models.TrialModel.__table__
    learnt: dict[tuple[int, str], BaseDistribution] = {}
    for trial_id, name, distribution in params:
        key = (studies[trial_id], name)
        earlier = learnt.get(key) or known.get(key)
        if earlier is None:
            stored = conn.execute(
                sqlalchemy.select(table.c.distribution_json)
                .join(trials, trials.c.trial_id == table.c.trial_id)
                .where(trials.c.study_id == key[0], table.c.param_name == name)
                .limit(1)
            ).scalar()
            earlier = json_to_distribution(stored) if stored is not None else None
        if earlier is not None:
            check_distribution_compatibility(earlier, distribution)
        learnt[key] = earlier or distribution
    return learnt


def relax_sqlite_sync(storage: BaseStorage) -> None:
    """``PRAGMA synchronous=NORMAL`` on every connection of a SQLite RDB storage: in WAL mode a
    commit then no longer waits for the disk; a crash of the process loses nothing committed,
    a power loss may lose the last commits (the trade :mod:`search.record.writeback` makes)."""
    backend = rdb_backend(storage)
    engine = getattr(backend, "engine", None)
    if engine is None or engine.dialect.name != "sqlite":
        return
    import sqlalchemy

    def _normal(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA synchronous=NORMAL")

    sqlalchemy.event.listen(engine, "connect", _normal)
    engine.dispose()  # pooled connections reconnect with the pragma
