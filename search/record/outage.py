"""A study's database that stops answering for a while (a PostgreSQL restart or failover, a
SQLite file another process holds locked) does not end the run.

While trials run, every storage call the driver makes goes through one :class:`Outage`
(:class:`~search.record.writeback.WriteBehindStorage` and its writer thread share it): a call
that fails because the database does not answer is tried again, with a growing pause, for up
to :data:`OUTAGE_S` seconds from the first failure. The run says so in one line when the
database goes and one when it comes back; meanwhile the trials go on training in Ray, and
what they report waits, in order, in the write-behind queue and in Ray, until it can be
written. Past the limit the run stops with one line (:class:`StorageOutageError`): it writes
nothing more, and the next ``run`` of the study settles what it left RUNNING (FAIL
``interrupted``, replaced; :mod:`search.record.resume`).

Every write the queue retries is idempotent; creating a trial is not, and a commit whose
answer the outage swallowed may leave one extra trial, never run, that the next run settles.
PostgreSQL connections also get a connect timeout (:data:`CONNECT_TIMEOUT_S`) and a
statement timeout (:data:`STATEMENT_TIMEOUT_S`): a server that accepts connections but never
answers is an outage too, not a hang.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from search.errors import SearchError, causes, database_locked, disk_full, one_line

_log = logging.getLogger(__name__)
T = TypeVar("T")

OUTAGE_S = float(os.environ.get("SEARCH_STORAGE_OUTAGE_S", "120"))
"""How long a run waits for its study's database to answer again before it stops."""
CONNECT_TIMEOUT_S = 10
"""PostgreSQL: the most seconds one connection attempt waits."""
STATEMENT_TIMEOUT_S = 60
"""PostgreSQL: the most seconds one statement runs."""
FIRST_PAUSE_S, LONGEST_PAUSE_S = 0.5, 5.0

_GONE = re.compile(
    r"could not connect|connection refused|server closed the connection|terminating connection"
    r"|connection (is|was|has been) closed|could not (receive|send) data|timeout expired"
    r"|the database system is (starting up|shutting down|in recovery mode)|ssl syscall"
    r"|canceling statement due to statement timeout|connection timeout|consuming input failed",
    re.IGNORECASE,
)


class StorageOutageError(SearchError):
    """The study's database did not answer for longer than the run waits."""


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the database did not answer (a lost or refused connection, a
    timeout, a SQLite file locked past its busy timeout), as opposed to a refused write.

    Example:
        >>> is_outage(RuntimeError("connection refused")), is_outage(KeyError("x"))
        (True, False)
    """
    chain = causes(exc)
    if any(disk_full(e) is not None for e in chain):
        return False
    if database_locked(exc):
        return True
    return any(getattr(e, "connection_invalidated", False) or _GONE.search(str(e)) for e in chain)


class Outage:
    """Calls a storage method, again and again while the database does not answer, for up to
    ``limit_s`` seconds from the first failure (module docstring). Shared by the threads of
    one driver: the first failure says the database went, the first success after it says it
    is back.

    Args:
        limit_s: The longest outage the run waits out.
    """

    def __init__(self, limit_s: float | None = None) -> None:
        self.limit_s = OUTAGE_S if limit_s is None else limit_s
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic time of the first failure of this outage
        self.gave_up: str | None = None
        """The line the run stops with, once the outage outlasted ``limit_s``."""

    def call(self, method: Callable[..., T], *args: Any) -> T:
        """``method(*args)``, tried again while the database does not answer.

        Raises:
            StorageOutageError: Once the database has not answered for ``limit_s`` seconds
                (and at once after that, for every call).
        """
        pause = FIRST_PAUSE_S
        while True:
            if self.gave_up is not None:
                raise StorageOutageError(self.gave_up)
            try:
                result = method(*args)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                time.sleep(self._wait(exc, pause))
                pause = min(2 * pause, LONGEST_PAUSE_S)
                continue
            if self._since is not None:
                self._back()
            return result

    def _wait(self, exc: Exception, pause: float) -> float:
        """Notes a failed call; the pause before the next try (raises past the limit)."""
        now = time.monotonic()
        with self._lock:
            if self._since is None:
                self._since = now
                _log.warning(
                    "the study's database stopped answering (%s); trying again for up to "
                    "%.0f s while the trials go on",
                    one_line(causes(exc)[-1], limit=200),
                    self.limit_s,
                )
            left = self.limit_s - (now - self._since)
            if left <= 0 and self.gave_up is None:
                self.gave_up = (
                    f"the study's database did not answer for {self.limit_s:.0f} s "
                    f"({one_line(causes(exc)[-1], limit=200)}); the run stopped; the same "
                    "command continues the study once it answers (SEARCH_STORAGE_OUTAGE_S "
                    "sets how long a run waits)"
                )
            if self.gave_up is not None:
                raise StorageOutageError(self.gave_up) from exc
        return min(pause, left)

    def _back(self) -> None:
        with self._lock:
            if self._since is None:
                return
            _log.warning(
                "the study's database answers again, after %.0f s",
                time.monotonic() - self._since,
            )
            self._since = None


def postgres_timeouts() -> dict[str, Any]:
    """The engine arguments of a PostgreSQL storage: a connect timeout, a statement timeout,
    and a check of each pooled connection before use (a server restart closes them all)."""
    return {
        "pool_pre_ping": True,
        "connect_args": {
            "connect_timeout": CONNECT_TIMEOUT_S,
            "options": f"-c statement_timeout={STATEMENT_TIMEOUT_S * 1000}",
        },
    }
