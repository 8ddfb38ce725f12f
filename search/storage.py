"""Optuna storage URLs: secrets from the environment, redaction, and the embedded default.

The default is a SQLite file. It is opened in WAL mode with a busy timeout, so that a reader
(``optuna-dashboard``, ``search trials``) never makes a running study fail with "database is
locked".
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import optuna

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
SQLITE_TIMEOUT_S = 60


def expand(url: str) -> str:
    """Replaces ``${VAR}`` in ``url`` with the environment's value (for passwords).

    Raises:
        KeyError: When a named variable is not set.
    """
    return _VAR.sub(lambda m: os.environ[m.group(1)], url)


def redact(url: str) -> str:
    """The URL with any password replaced by ``***``, safe to print or store.

    Example:
        >>> redact("postgresql://bob:s3cret@db:5432/optuna")
        'postgresql://bob:***@db:5432/optuna'
        >>> redact("postgresql://bob:${PGPASSWORD}@db/optuna")  # a reference is no secret
        'postgresql://bob:${PGPASSWORD}@db/optuna'
    """
    return re.sub(r"(://[^:/@]+:)(?!\$\{)[^@]*@", r"\1***@", url)


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna storage for ``url``; SQLite files get their folder, WAL and a busy timeout."""
    real = expand(url)
    if not real.startswith("sqlite:///"):
        return optuna.storages.RDBStorage(real, heartbeat_interval=None)
    path = Path(real.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)
    storage = optuna.storages.RDBStorage(
        real, engine_kwargs={"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    )
    with storage.engine.connect() as conn:  # WAL: readers and the writer no longer block
        conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    return storage
