"""A SQLite study file that a kill cannot leave half made (search/record/sqlite_file.py).

The fault was seen in tests/test_chaos.py on a loaded machine. A driver was killed while
Optuna created the schema, which left the ``studies`` table without its unique index. After
that, every resume added a study of the same name, and every ``load_study`` failed.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from search.errors import SearchError
from search.record.storage import open_storage
from tests.helpers import REPO

# A real process that kills itself with SIGKILL at the point where a kill does the harm: after
# Optuna's CREATE TABLE statements, as it creates the index on the study name.
KILLED_IN_CREATION = """
import os, signal, sys
import sqlalchemy

def kill_at_the_index(conn, cursor, statement, *args):
    if statement.lstrip().startswith("CREATE UNIQUE INDEX ix_studies_study_name"):
        os.kill(os.getpid(), signal.SIGKILL)
sqlalchemy.event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", kill_at_the_index)

if sys.argv[2] == "search":
    from search.record.storage import open_storage
    open_storage(sys.argv[1])
else:
    import optuna
    optuna.storages.RDBStorage(sys.argv[1])
"""


def _killed_while_creating(url: str, opener: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", KILLED_IN_CREATION, url, opener], cwd=REPO, timeout=120
    )
    assert done.returncode == -9  # killed where it meant to be


def _indexes(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        return {name for (name,) in rows}


def test_a_kill_while_the_schema_is_made_leaves_no_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/o.db"
    _killed_while_creating(f"sqlite:///{tmp_path}/plain.db", "optuna")
    assert "ix_studies_study_name" not in _indexes(tmp_path / "plain.db")  # the fault, as seen
    _killed_while_creating(url, "search")
    assert not (tmp_path / "o.db").exists()  # only the hidden half-made file
    storage = open_storage(url)
    for _ in range(2):  # a run, then its resume
        optuna.create_study(study_name="s", storage=storage, load_if_exists=True)
    assert optuna.get_all_study_names(storage) == ["s"]
    assert "ix_studies_study_name" in _indexes(tmp_path / "o.db")


def _half_made(db: Path) -> str:
    """A file as a kill left it (the unique index missing), whose study ``s`` has one trial and
    was then resumed once, which made an empty second ``s``."""
    url = f"sqlite:///{db}"
    study = optuna.create_study(study_name="s", storage=url)
    study.add_trial(optuna.trial.create_trial(value=1.0))
    with sqlite3.connect(db) as conn:
        conn.execute("DROP INDEX ix_studies_study_name")
    with pytest.raises(optuna.exceptions.StorageInternalError):  # what every later run met:
        optuna.create_study(study_name="s", storage=url, load_if_exists=True)  # a second s
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM studies").fetchone() == (2,)
    return url


def test_a_half_made_file_gets_its_index_and_its_study_back(tmp_path: Path) -> None:
    url = _half_made(tmp_path / "o.db")
    storage = open_storage(url)
    study = optuna.load_study(study_name="s", storage=storage)
    assert [t.value for t in study.trials] == [1.0]
    assert "ix_studies_study_name" in _indexes(tmp_path / "o.db")
    optuna.create_study(study_name="s", storage=storage, load_if_exists=True)
    assert optuna.get_all_study_names(storage) == ["s"]  # a resume no longer repeats it


def test_repeats_that_both_hold_trials_stop_in_one_line(tmp_path: Path) -> None:
    url = _half_made(tmp_path / "o.db")
    with sqlite3.connect(tmp_path / "o.db") as conn:  # a trial in the second study too
        (second,) = conn.execute("SELECT MAX(study_id) FROM studies").fetchone()
    optuna.storages.RDBStorage(url).create_new_trial(second)
    with pytest.raises(SearchError, match=r"a study name appears more than once") as caught:
        open_storage(url)
    assert "\n" not in str(caught.value)
