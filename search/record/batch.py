"""Several trial writes in one database transaction, and SQLite commits that do not wait for
the disk.

Optuna's RDB storage commits each ``set_trial_param``, ``set_trial_user_attr``,
``set_trial_system_attr`` and ``set_trial_intermediate_value`` on its own: on SQLite that is
one transaction (and one lock of the database file) per write. The write-behind queue
(:mod:`search.record.writeback`) gathers the writes made while the previous ones were
committed; this module commits them together, with the same per-write code Optuna runs (its
``_without_commit`` helpers), so what is stored is what the writes made one by one would
store. It relies on those private helpers because Optuna offers no public batch write;
:func:`write_together` says ``False`` when the storage is not an RDB storage or the helpers
are gone, and the caller then writes one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from optuna.storages import BaseStorage, RDBStorage

from search.record.storage import rdb_backend

Write = tuple[int, str, tuple[Any, ...]]
"""One queued write: ``(trial_id, storage method name, its arguments after trial_id)``."""


def write_together(storage: BaseStorage, writes: Sequence[Write]) -> bool:
    """Commits ``writes`` in one transaction, in order; ``False`` (nothing written) when
    ``storage`` cannot, and raises (nothing written) when any write fails.

    Example:
        >>> import optuna
        >>> write_together(optuna.storages.InMemoryStorage(), [(0, "set_trial_user_attr",
        ...                                                    ("k", 1))])
        False
    """
    backend = rdb_backend(storage)
    if not isinstance(backend, RDBStorage) or not _has_helpers(backend):
        return False
    from optuna.storages._rdb import models

    attr_models: dict[str, Any] = {
        "set_trial_user_attr": models.TrialUserAttributeModel,
        "set_trial_system_attr": models.TrialSystemAttributeModel,
    }
    session = backend.scoped_session()
    try:
        for trial_id, method, args in writes:
            if method == "set_trial_intermediate_value":
                backend._set_trial_intermediate_value_without_commit(session, trial_id, *args)
            elif method == "set_trial_param":
                backend._set_trial_param_without_commit(session, trial_id, *args)
            elif method in attr_models:
                backend._set_trial_attr_without_commit(
                    session, attr_models[method], trial_id, *args
                )
            else:
                raise ValueError(f"{method} is not a write this batch knows")
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return True


def _has_helpers(backend: Any) -> bool:
    return all(
        hasattr(backend, name)
        for name in (
            "scoped_session",
            "_set_trial_intermediate_value_without_commit",
            "_set_trial_attr_without_commit",
            "_set_trial_param_without_commit",
        )
    )


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
