"""Reading many trials at once from an RDB storage: six plain SELECTs instead of the ORM.

Optuna's RDB storage reads a study's trials through SQLAlchemy's ORM: one object per row of six
tables, then one :class:`~optuna.trial.FrozenTrial` per trial, parsing every parameter's
distribution JSON twice. At 10,000 trials of the ``cnn`` space that is 160,000 ORM objects and
180,000 JSON parses (seconds: most of ``search trials`` and of a driver's first read when it
resumes a big study). Optuna has no faster public read, so :func:`read_trials`
selects the same rows with SQLAlchemy Core, builds the same trials, and parses each distinct
distribution once. :class:`BulkReadRDBStorage` is Optuna's RDB storage with that read: every
bulk read (``get_all_trials``, Optuna's trial cache, the samplers, ``trials``, ``report``) goes
through it; everything else is Optuna's.

The tables are read trials first, then the trials' rows in the other five: a trial seen finished
has its values already committed (``tell`` writes both in one transaction), so no trial is
built finished without them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Container
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import sqlalchemy as sa
from optuna import distributions
from optuna.storages import RDBStorage
from optuna.storages._rdb import models
from optuna.trial import FrozenTrial, TrialState

_log = logging.getLogger(__name__)

_IntermediateType = models.TrialIntermediateValueModel.TrialIntermediateValueType
_SPECIAL = {
    _IntermediateType.NAN: float("nan"),
    _IntermediateType.INF_POS: float("inf"),
    _IntermediateType.INF_NEG: float("-inf"),
    models.TrialValueModel.TrialValueType.INF_POS: float("inf"),
    models.TrialValueModel.TrialValueType.INF_NEG: float("-inf"),
}


class BulkReadRDBStorage(RDBStorage):
    """Optuna's :class:`~optuna.storages.RDBStorage`, reading many trials with
    :func:`read_trials`; falls back to Optuna's own read if that fails (a schema Optuna has
    since changed), with a warning."""

    def _get_trials(
        self,
        study_id: int,
        states: Container[TrialState] | None,
        included_trial_ids: set[int],
        trial_id_greater_than: int,
    ) -> list[FrozenTrial]:
        try:
            return read_trials(
                self.engine, study_id, states, included_trial_ids, trial_id_greater_than
            )
        except KeyError:
            raise
        except Exception as exc:  # Optuna's read is slower, never wrong
            _log.warning("bulk trial read failed (%s); reading through Optuna's ORM", exc)
            return super()._get_trials(study_id, states, included_trial_ids, trial_id_greater_than)


def read_trials(
    engine: sa.Engine,
    study_id: int,
    states: Container[TrialState] | None = None,
    included_trial_ids: Collection[int] = (),
    trial_id_greater_than: int = -1,
) -> list[FrozenTrial]:
    """The study's trials by id, as Optuna's RDB storage's ``_get_trials`` returns them.

    Args:
        engine: The storage's SQLAlchemy engine.
        study_id: The study's id in the storage.
        states: Only trials in these states (all when ``None``).
        included_trial_ids: With ``trial_id_greater_than``, also these trials (at or below it).
        trial_id_greater_than: Only trials with a larger id, and ``included_trial_ids``
            (all trials when -1).

    Raises:
        KeyError: When the storage has no study ``study_id``.
    """
    trials_t = models.TrialModel.__table__
    where = trials_t.c.study_id == study_id
    if states is not None:
        where &= trials_t.c.state.in_(list(states))  # type: ignore[call-overload]
    if trial_id_greater_than > -1:
        newer = trials_t.c.trial_id > trial_id_greater_than
        included = [i for i in included_trial_ids if i <= trial_id_greater_than]
        where &= sa.or_(newer, trials_t.c.trial_id.in_(included)) if included else newer
    with engine.connect() as conn:
        _check_study(conn, study_id)
        heads = conn.execute(
            sa.select(
                trials_t.c.trial_id,
                trials_t.c.number,
                trials_t.c.state,
                trials_t.c.datetime_start,
                trials_t.c.datetime_complete,
            )
            .where(where)
            .order_by(trials_t.c.trial_id)
        ).all()
        if not heads:
            return []
        ids = sa.select(trials_t.c.trial_id).where(where).scalar_subquery()
        parts = {row.trial_id: _Parts() for row in heads}
        _read_parts(conn, ids, parts)
    return [
        parts[row.trial_id].frozen(
            row.trial_id, row.number, row.state, row.datetime_start, row.datetime_complete
        )
        for row in heads
    ]


class _Parts:
    """One trial's rows of the five child tables, gathered before its FrozenTrial is built."""

    __slots__ = ("values", "params", "distributions", "user", "system", "steps")

    def __init__(self) -> None:
        self.values: dict[int, float] = {}
        self.params: dict[str, Any] = {}
        self.distributions: dict[str, distributions.BaseDistribution] = {}
        self.user: dict[str, Any] = {}
        self.system: dict[str, Any] = {}
        self.steps: dict[int, float] = {}

    def frozen(
        self,
        trial_id: int,
        number: int,
        state: TrialState,
        start: datetime | None,
        complete: datetime | None,
    ) -> FrozenTrial:
        values = [self.values[i] for i in sorted(self.values)] if self.values else None
        return FrozenTrial(
            number=number,
            state=state,
            value=None,
            values=values,
            datetime_start=_local(start),
            datetime_complete=_local(complete),
            params=self.params,
            distributions=self.distributions,
            user_attrs=self.user,
            system_attrs=self.system,
            intermediate_values=self.steps,
            trial_id=trial_id,
        )


def _read_parts(conn: sa.Connection, ids: Any, parts: dict[int, _Parts]) -> None:
    """Fills ``parts`` from the child tables' rows of the trials ``ids`` selects (rows of
    trials created since the trials were read are left out)."""

    def rows(model: Any, *columns: str) -> Any:
        table = model.__table__
        pk = table.primary_key.columns.values()[0]
        query = sa.select(table.c.trial_id, *(table.c[c] for c in columns))
        return conn.execute(query.where(table.c.trial_id.in_(ids)).order_by(pk))

    for trial_id, objective, value, kind in rows(
        models.TrialValueModel, "objective", "value", "value_type"
    ):
        if trial_id in parts:
            parts[trial_id].values[objective] = _SPECIAL.get(kind, value)
    for trial_id, name, value, text in rows(
        models.TrialParamModel, "param_name", "param_value", "distribution_json"
    ):
        if trial_id in parts:
            dist = _distribution(text)
            parts[trial_id].distributions[name] = dist
            parts[trial_id].params[name] = dist.to_external_repr(value)
    for model, field in (
        (models.TrialUserAttributeModel, "user"),
        (models.TrialSystemAttributeModel, "system"),
    ):
        for trial_id, key, text in rows(model, "key", "value_json"):
            if trial_id in parts:
                getattr(parts[trial_id], field)[key] = json.loads(text)
    for trial_id, step, value, kind in rows(
        models.TrialIntermediateValueModel,
        "step",
        "intermediate_value",
        "intermediate_value_type",
    ):
        if trial_id in parts:
            parts[trial_id].steps[step] = _SPECIAL.get(kind, value)


def _check_study(conn: sa.Connection, study_id: int) -> None:
    studies = models.StudyModel.__table__
    found = conn.execute(
        sa.select(studies.c.study_id).where(studies.c.study_id == study_id)
    ).first()
    if found is None:
        raise KeyError(f"No study with study_id {study_id} exists.")


@lru_cache(maxsize=4096)
def _distribution(text: str) -> distributions.BaseDistribution:
    """A distribution from its JSON, parsed once per distinct text (distributions are
    immutable, and a study has a few per parameter)."""
    return distributions.json_to_distribution(text)


def _local(stamp: datetime | None) -> datetime | None:
    """A stored naive UTC time as naive local time, as Optuna's trial model converts it."""
    if stamp is None:
        return None
    return stamp.replace(tzinfo=UTC).astimezone().replace(tzinfo=None)
