"""A SQLite study file that a kill cannot leave half made.

Optuna creates its schema one statement at a time, and Python's ``sqlite3`` commits each
``CREATE`` on its own. A driver killed in its first seconds (``kill -9``, a preemption) can
leave a file whose ``studies`` table lacks its unique index on the name. Optuna never makes
that index afterwards (it skips the tables that exist), so every later
``create_study(load_if_exists=True)`` adds one more study of the same name, and every
``load_study`` of it fails with "An exception is raised during the commit". That was seen in
``tests/test_chaos.py`` on a loaded machine. So:

- a new file is made whole beside its place, then linked there (:func:`create_whole`): the
  file is either absent or holds the whole schema;
- a file made before that gets its missing indexes back, after losing the empty studies that
  repeated a name (:func:`repair_indexes`).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path

import optuna
import sqlalchemy
from optuna.storages._rdb import models  # the schema's tables and indexes (no public name)

from search.errors import SearchError

STALE_S = 600.0
"""A half-made file older than this is the litter of a killed driver, and is removed."""


def create_whole(path: Path) -> None:
    """Makes the SQLite file ``path`` with Optuna's whole schema, unless it exists.

    The schema is written to a hidden file beside ``path``, which is then hard-linked to
    ``path``: a kill at any point leaves either no file or a whole one. When two drivers race,
    the first link wins and the other's file is dropped.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> create_whole(folder / "o.db")
        >>> sorted(p.name for p in folder.iterdir())
        ['o.db']
    """
    if path.exists():
        return
    _remove_stale(path)
    part = path.with_name(f".{path.name}.{uuid.uuid4().hex}.creating")
    try:
        storage = optuna.storages.RDBStorage(f"sqlite:///{part}")
        storage.engine.dispose()
        try:
            os.link(part, path)
        except FileExistsError:
            pass  # another driver made it first
        except OSError:  # a filesystem without hard links: a rename, which may overwrite
            if not path.exists():
                os.replace(part, path)
    finally:
        for leftover in (part, Path(f"{part}-journal")):
            leftover.unlink(missing_ok=True)


def _remove_stale(path: Path) -> None:
    """Removes the half-made files of drivers killed while they made ``path``."""
    now = time.time()
    for litter in path.parent.glob(f".{path.name}.*.creating*"):
        with contextlib.suppress(OSError):
            if now - litter.stat().st_mtime > STALE_S:
                litter.unlink()


def repair_indexes(storage: optuna.storages.RDBStorage) -> None:
    """Makes the indexes of Optuna's schema that a SQLite file lacks.

    A file half made before :func:`create_whole` existed may hold the same study name more
    than once. The repeats that hold no trial are deleted: they were made by a
    ``load_if_exists`` that found no unique index, and nothing used them after.

    Raises:
        SearchError: When repeats of a name both hold trials, so neither can be dropped.
    """
    with storage.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'index'")
        have = {name for (name,) in rows}
    tables = models.BaseModel.metadata.tables.values()
    wanted = [index for table in tables for index in table.indexes]
    missing = [index for index in wanted if index.name not in have]
    if not missing:
        return
    for study_id in _empty_repeats(storage):
        storage.delete_study(study_id)
    try:
        for index in missing:
            index.create(storage.engine, checkfirst=True)
    except sqlalchemy.exc.IntegrityError as exc:  # names still repeated; other errors rise as such
        raise SearchError(
            f"storage {storage.url}: a study name appears more than once, with trials in each "
            "(the file was made by a driver killed while it created it): copy the studies "
            "out with optuna.copy_study, then remove the file"
        ) from exc


def _empty_repeats(storage: optuna.storages.RDBStorage) -> list[int]:
    """The studies that repeat an earlier study's name and hold no trial."""
    query = (
        "SELECT s.study_id FROM studies s WHERE EXISTS (SELECT 1 FROM studies o WHERE "
        "o.study_name = s.study_name AND o.study_id < s.study_id) AND NOT EXISTS "
        "(SELECT 1 FROM trials t WHERE t.study_id = s.study_id)"
    )
    with storage.engine.connect() as conn:
        return [study_id for (study_id,) in conn.exec_driver_sql(query)]
