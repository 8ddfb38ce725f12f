"""Optuna storage URLs: secrets from the environment, redaction, and the embedded default.

The default is a SQLite file. It is opened in WAL mode with a busy timeout, so that a reader
(``optuna-dashboard``, ``search trials``) never makes a running study fail with "database is
locked".
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import optuna

from search.errors import DiskFullError, disk_full, one_line
from search.record.bulk import BulkReadRDBStorage
from search.record.outage import postgres_timeouts
from search.record.sqlite_file import create_whole, repair_indexes

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
SQLITE_TIMEOUT_S = 60
FULL_BELOW_BYTES = 1 << 20  # a filesystem with less free space than this counts as full


def expand(url: str) -> str:
    """Replaces ``${VAR}`` in ``url`` with the environment's value (for passwords).

    A value in the ``user:password@`` part is percent-encoded, so a password holding ``@``,
    ``/`` or ``:`` stays whole (SQLAlchemy decodes it) instead of spilling into the host name,
    and from there into error messages.

    Example:
        >>> os.environ["DOC_PW"] = "p@ss/w:rd"
        >>> expand("postgresql://bob:${DOC_PW}@db/optuna")
        'postgresql://bob:p%40ss%2Fw%3Ard@db/optuna'

    Raises:
        KeyError: When a named variable is not set.
    """

    def plain(text: str) -> str:
        return _VAR.sub(lambda m: os.environ[m.group(1)], text)

    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not sep or not at:
        return plain(url)
    quoted = _VAR.sub(lambda m: quote(os.environ[m.group(1)], safe=""), userinfo)
    return f"{scheme}{sep}{quoted}{at}{plain(host)}{slash}{plain(path)}"


def redact(url: str) -> str:
    """The URL with any password replaced by ``***``, safe to print or store.

    The password runs from the user name's ``:`` to the *last* ``@`` of the URL's authority,
    so an unencoded ``@`` inside it is masked too (masking too much is safe; too little leaks).

    Example:
        >>> redact("postgresql://bob:s3cret@db:5432/optuna")
        'postgresql://bob:***@db:5432/optuna'
        >>> redact("postgresql://bob:${PGPASSWORD}@db/optuna")  # a reference is no secret
        'postgresql://bob:${PGPASSWORD}@db/optuna'
        >>> redact("postgresql://:s3cret@db/optuna?sslmode=require&password=s3cret")
        'postgresql://:***@db/optuna?sslmode=require&password=***'
        >>> redact("postgresql://bob:p@ss@w0rd@db/optuna")
        'postgresql://bob:***@db/optuna'
    """
    url = re.sub(r"(://[^:/@]*:)(?!\$\{\w+\}@[^@]*$)[^?#]*@", r"\1***@", url)
    return re.sub(r"([?&]password=)(?!\$\{\w+\}(?:&|$))[^&]*", r"\1***", url)


def redacted_spec(data: Mapping[str, Any]) -> dict[str, Any]:
    """A spec's data with the password of every URL in it masked (the storage, the tracking
    URI, export's MLflow URI): what is stored or handed on.

    Example:
        >>> redacted_spec({"storage": "sqlite:///o.db", "tracking": {"mlflow": "http://a:pw@h"}})
        {'storage': 'sqlite:///o.db', 'tracking': {'mlflow': 'http://a:***@h'}}
    """
    out = dict(data)
    if isinstance(out.get("storage"), str):
        out["storage"] = redact(out["storage"])
    for path in (("tracking", "mlflow"), ("export", "mlflow", "tracking_uri")):
        node = out
        for key in path[:-1]:
            if not isinstance(node.get(key), Mapping):
                break
            node[key] = node = dict(node[key])
        else:
            if isinstance(node.get(path[-1]), str):
                node[path[-1]] = redact(node[path[-1]])
    return out


def expand_quiet(url: str) -> str:
    """:func:`expand`, or ``url`` itself when a variable it names is not set."""
    try:
        return expand(url)
    except KeyError:
        return url


def scrub(text: str, url: str) -> str:
    """``text`` (an error message that may quote ``url``, expanded or not) in one line, with
    ``url``'s password masked.

    Example:
        >>> scrub("failed: http://bob:s3cret@host:5000/api", "http://bob:s3cret@host:5000")
        'failed: http://bob:***@host:5000/api'
    """
    for raw in {url, expand_quiet(url)}:
        text = text.replace(raw, redact(raw))
    return redact(one_line(text))


def with_driver(url: str) -> str:
    """``postgresql://`` made explicit as ``postgresql+psycopg://`` (psycopg 3, a dependency),
    whatever SQLAlchemy's default driver for the scheme is."""
    return (
        "postgresql+psycopg://" + url[len("postgresql://") :]
        if url.startswith("postgresql://")
        else url
    )


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna storage for ``url`` that reads many trials fast (:mod:`search.record.bulk`);
    SQLite files get their folder, WAL, a busy timeout and a schema a kill cannot leave half
    made (:mod:`search.record.sqlite_file`)."""
    real = with_driver(expand(url))
    if real.startswith("postgresql+psycopg://"):  # a server that stops answering: a timeout
        return BulkReadRDBStorage(real, postgres_timeouts(), heartbeat_interval=None)
    if not real.startswith("sqlite:///"):
        return BulkReadRDBStorage(real, heartbeat_interval=None)
    path = Path(real.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)
    create_whole(path)  # never half a schema, whenever a driver is killed
    storage = BulkReadRDBStorage(
        real, engine_kwargs={"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    )
    with storage.engine.connect() as conn:  # WAL: readers and the writer no longer block
        conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    repair_indexes(storage)
    return storage


def rdb_backend(storage: optuna.storages.BaseStorage) -> Any:
    """The storage under Optuna's cache (``load_study`` and ``create_study`` wrap an RDB
    storage in one): what holds the SQLAlchemy engine. ``storage`` itself when uncached.

    Example:
        >>> memory = optuna.storages.InMemoryStorage()
        >>> rdb_backend(memory) is memory
        True
    """
    return getattr(storage, "_backend", storage)


def full_disk_error(exc: BaseException, places: list[str]) -> DiskFullError | None:
    """The one line for ``exc`` when it is a full disk (:func:`search.errors.disk_full`),
    else ``None``.

    It names the file the error names; else the first of ``places`` (storage URLs, redacted,
    and folders) whose filesystem is full; else the first SQLite place, for SQLite's own
    ``database or disk is full``; else the first place.
    """
    where = disk_full(exc)
    if where is None:
        return None
    folders = {place: _local_path(place) for place in places if place}
    full = [place for place, path in folders.items() if path is not None and _is_full(path)]
    sqlite = [place for place in folders if place.startswith("sqlite:")]
    shown = where or next(iter(full or sqlite or list(folders)), "the disk the run writes to")
    return DiskFullError(redact(shown))


def _local_path(place: str) -> Path | None:
    """The local file or folder of a SQLite URL or a folder; ``None`` for a server."""
    if "://" not in place:
        return Path(place)
    try:
        real = expand(place) if place.startswith("sqlite:///") else ""
    except KeyError:  # a ${VAR} not set: not a place to look at
        return None
    return Path(real.removeprefix("sqlite:///").split("?", 1)[0]) if real else None


def _is_full(path: Path) -> bool:
    """Whether the filesystem holding ``path`` (or its nearest existing folder) is full."""
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free < FULL_BELOW_BYTES
    except OSError:
        return False
