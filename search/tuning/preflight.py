"""Checks a run makes before any trial starts: storage, data, the Ray cluster to join.

Each check raises :class:`PreflightError` with one line naming the field and what is wrong, so
the CLI prints ``error: ...`` and exits 2 instead of failing minutes later, or hanging: Ray waits
minutes for an unreachable cluster, and a database driver may wait as long for its server.
Passwords never appear in a message (see :func:`search.record.storage.redact`).

Example:
    >>> check_ray_address("127.0.0.1:1", timeout_s=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    search.tuning.preflight.PreflightError: --address: cannot reach the Ray cluster at ...
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.compute.cluster import init_ray, use_cluster_token
from search.compute.data import DataError, loader_function
from search.errors import SearchError, one_line
from search.record.storage import expand, redact, with_driver
from search.specs.knobs import check_builtin_knobs, check_user_trainable
from search.tuning.fusion import refusal as fusion_refusal

if TYPE_CHECKING:
    from search.specs.schema import StudySpec

TIMEOUT_S = 5.0
"""How long a check waits for a server (database, Ray) to answer."""

RAY_PORT = 6379
RAY_CLIENT_PORT = 10001
_SQLITE_MAGIC = b"SQLite format 3\x00"


class PreflightError(SearchError):
    """Something a run needs is missing or unreachable; ``str()`` is one line."""


def _reason(exc: BaseException, *secrets: str) -> str:
    """The first line of an error, secrets masked, short enough for one console line."""
    orig = getattr(exc, "orig", None) or exc  # SQLAlchemy wraps the driver's error
    text = str(orig).strip() or type(orig).__name__
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return one_line(" ".join(one_line(text, where="first").split()), limit=200)


def check_storage(url: str, field: str = "storage", timeout_s: float = TIMEOUT_S) -> None:
    """Checks that the Optuna storage ``url`` can be opened, without creating anything.

    SQLite: the file's folder can be created and written, and an existing file is a SQLite
    database. A server database: the driver is installed and the server accepts a connection
    within ``timeout_s``.

    Raises:
        PreflightError: ``<field>: ...`` with the URL's password redacted.
    """
    shown = redact(url)
    try:
        real = with_driver(expand(url))
    except KeyError as exc:
        raise PreflightError(
            f"{field}: environment variable {exc.args[0]} is not set (the URL {shown} uses it)"
        ) from None
    if real.startswith("sqlite:"):
        _check_sqlite(real, field)
        return

    import sqlalchemy
    from sqlalchemy.pool import NullPool

    try:
        parsed = sqlalchemy.engine.make_url(real)
        connect_args: dict[str, Any] = {}
        if parsed.get_backend_name() in ("postgresql", "mysql", "mariadb"):
            connect_args["connect_timeout"] = max(1, round(timeout_s))
        engine = sqlalchemy.create_engine(real, connect_args=connect_args, poolclass=NullPool)
    except Exception as exc:  # bad URL, unknown dialect, driver not installed
        raise PreflightError(
            f"{field}: {shown} is not a usable storage URL ({_reason(exc, real)})"
        ) from None
    password = parsed.password if isinstance(parsed.password, str) else ""
    try:
        with engine.connect():
            pass
    except Exception as exc:
        raise PreflightError(
            f"{field}: cannot connect to {shown} ({_reason(exc, password)})"
        ) from None
    finally:
        engine.dispose()


def check_tracking(spec: StudySpec, field: str = "tracking.mlflow") -> None:
    """Checks that the variables a ``tracking`` URI names are set. Whether its server answers
    is not checked: the study runs without it (:mod:`search.record.tracking.tracker`)."""
    if spec.tracking is None:
        return
    try:
        expand(spec.tracking.mlflow)
    except KeyError as exc:
        raise PreflightError(
            f"{field}: environment variable {exc.args[0]} is not set "
            f"(the URI {redact(spec.tracking.mlflow)} uses it)"
        ) from None


def _check_sqlite(real: str, field: str) -> None:
    database = real.removeprefix("sqlite:").removeprefix("///").split("?", 1)[0]
    if database in ("", "//", ":memory:"):
        return
    path = Path(database)
    if path.is_dir():
        raise PreflightError(f"{field}: {path} is a folder, not a SQLite file")
    if path.exists():
        with path.open("rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
        if head and head != _SQLITE_MAGIC:
            raise PreflightError(f"{field}: {path} exists and is not a SQLite database")
        if not os.access(path, os.R_OK | os.W_OK):
            raise PreflightError(f"{field}: {path} cannot be read and written")
        return
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise PreflightError(f"{field}: cannot create {path}: {folder} is not a writable folder")


def check_data(spec: StudySpec, field: str = "data") -> None:
    """Checks that the folder or file the spec's ``data`` block names exists here.

    (Built-in datasets ship with their packages and name no path. A folder dataset must exist
    on every node that runs trials; only the driver's machine can be checked here.)
    """
    data = spec.data
    if data.loader is not None:
        try:
            loader_function(data.loader)
        except DataError as exc:
            raise PreflightError(f"{field}.loader: {str(exc).split(': ', 1)[-1]}") from None
        return
    if data.path is None:  # the one field that names a place (``image_folder``'s folder)
        return
    path = Path(data.path).expanduser()
    if not path.exists():
        raise PreflightError(f"{field}.path: {data.path} does not exist")
    if data.name == "image_folder" and not path.is_dir():
        raise PreflightError(f"{field}.path: {data.path} is not a folder")


def _split_address(address: str) -> tuple[str, int]:
    target, default_port = address, RAY_PORT
    if target.startswith("ray://"):
        target, default_port = target.removeprefix("ray://"), RAY_CLIENT_PORT
    target = target.rstrip("/")
    if target.startswith("["):  # [IPv6]:port
        host, _, rest = target[1:].partition("]")
        port_text = rest.removeprefix(":")
    elif target.count(":") == 1:
        host, _, port_text = target.partition(":")
    else:
        host, port_text = target, ""
    if not host or any(c.isspace() or c in "/@?#" for c in host):
        raise ValueError(address)
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(address)
    return host, int(port_text)


def check_ray_address(address: str | None, timeout_s: float = TIMEOUT_S) -> None:
    """Checks that the Ray cluster at ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``)
    accepts a connection within ``timeout_s``; ``None``, ``local`` and ``auto`` pass."""
    if address is None or address in ("local", "auto"):
        return
    try:
        host, port = _split_address(address)
    except ValueError:
        raise PreflightError(
            f"--address: expected HOST:PORT of a Ray head node, got {address!r}"
        ) from None
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or ("timed out" if isinstance(exc, TimeoutError) else str(exc))
        raise PreflightError(
            f"--address: cannot reach the Ray cluster at {address} ({reason}); "
            "start it with `ray start --head` or fix the address"
        ) from None


@contextlib.contextmanager
def _stderr_captured() -> Iterator[list[str]]:
    """Collects what is written to file descriptor 2 (Ray's C++ core logs there, around
    Python's ``sys.stderr``) into the yielded list, once the block ends."""
    captured: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.append(tmp.read())


def _refused_token(texts: list[str]) -> bool:
    return any("InvalidAuthToken" in text or "Unauthenticated" in text for text in texts)


def join_ray(address: str) -> None:
    """Connects this driver to the Ray cluster at ``address``, one line if it cannot.

    Ray retries a refused token for many seconds, logging a line a second; one direct attempt
    first makes that case fail at once, and those lines are kept off the console.
    """
    refused = (
        f"--address: the Ray cluster at {address} refused this driver: copy the head node's "
        "~/.ray/auth_token to this machine (or set RAY_AUTH_TOKEN) and set RAY_AUTH_MODE=token"
    )
    texts: list[str] = []
    with _stderr_captured() as captured:
        try:
            if address not in ("auto",) and not address.startswith("ray://"):
                use_cluster_token(address)
                from ray._raylet import GcsClient  # type: ignore[attr-defined]

                try:
                    GcsClient(address=address)
                except Exception as exc:
                    texts.append(str(exc))
            if not _refused_token(texts):
                init_ray(address)
        except Exception as exc:
            cause: BaseException | None = exc
            while cause is not None and len(texts) < 8:
                texts.append(str(cause))
                cause = cause.__cause__ or cause.__context__
            texts.append(repr(exc))
            error: BaseException | None = exc
        else:
            error = None
    if _refused_token(texts + captured):
        raise PreflightError(refused)
    if error is not None:
        raise PreflightError(
            f"--address: cannot join the Ray cluster at {address} ({_reason(error)})"
        )
    sys.stderr.write("".join(captured))


def check_run(
    spec: StudySpec,
    address: str | None,
    storage_field: str = "storage",
    data_field: str = "data",
    source: str = "spec",
) -> None:
    """The checks ``run`` makes before it starts Ray; joins the cluster when ``address`` is
    given (so a refused token also fails here, in one line). A built-in's knobs are checked
    here, which imports nothing; a user's trainable is imported here, before Ray starts, and
    its knobs and shape checked (a function that returns instead of yielding), so that such a
    mistake costs no Ray start (:func:`search.specs.knobs.check_user_trainable`)."""
    if not check_builtin_knobs(spec, source):
        check_user_trainable(spec, source)
    if (why := fusion_refusal(spec)) is not None:
        raise PreflightError(why)
    check_data(spec, data_field)
    check_storage(spec.storage, storage_field)
    check_tracking(spec, f"{source}: tracking.mlflow")
    check_ray_address(address)
    if address not in (None, "local"):
        join_ray(address)
