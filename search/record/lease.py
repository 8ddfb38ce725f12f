"""One live driver per study: a lease on the study that its driver renews.

A second ``run`` on a study that a live driver holds is refused in one line, naming the
holder; two drivers never split one budget between them (each would count the other's
trials as it pleased, and TPE would see the other's RUNNING trials as its own).

The lease is the study user attribute ``driver``: a run id (a fresh UUID per run, never
``host:pid``, which a restarted container or a reboot hands out again), the host, the Linux
boot id, the pid with its start time, the lease's expiry (:data:`TTL_S`) and when it was last
renewed. The holder renews it every :data:`RENEW_S` seconds from a thread, and releases it when
the run ends. Another driver takes the study:

* at once when the lease was released;
* with ``--takeover``, at once;
* when its holder ran on this host and is verifiably gone (another boot, or no process with
  that pid and start time: ``kill -9``, a container restarted with PID 1 again), and the lease
  was not renewed for two renewal periods;
* else only once it has watched the lease go unrenewed for the whole expiry, measured on its
  own monotonic clock between its first read and its last (never by comparing the holder's
  clock with its own). A renewal seen meanwhile refuses the study in one line.

Taking over says so in one line, naming the holder and why. A pause of the holder (SIGSTOP, a
suspended VM, a long GC pause) cannot fake a renewal: every renewal is a compare-and-set
against the lease the holder last wrote, so a holder that wakes up to a lease taken never
writes it back. It learns at its next renewal or its next check (:meth:`StudyLease.holds`,
before and after every trial it asks for and before every trial it tells), stops asking for
trials, leaves its trials to the new holder (which settled every trial still RUNNING when it
took the study, :mod:`search.record.resume`) and exits with :data:`TAKEN_EXIT_STATUS` and one
line (:class:`StudyTakenError`).

A driver that started a local Ray records its processes in the lease too (``ray``: each
``[pid, start time]``, renewed with the lease: :meth:`StudyLease.keep`). Ray's agents outlive a
driver killed with ``kill -9``; its watcher stops them (:func:`~search.record.processes.watch_over`)
and, should it have died too, the next run that takes the lease from that verifiably gone
holder stops the recorded processes that are still the same processes and prove they are that
run's own (its id in their environment), and says how many (:mod:`search.record.processes`): a
forged lease makes it kill nothing. A driver that joined a cluster records none.

Taking or renewing a lease on an RDB storage (SQLite, PostgreSQL) is a compare-and-set in one
transaction: the lease is written only if the stored one is still the one this driver read,
so of two drivers started together the first writer keeps it and the other is refused at once.
On other storages it is write, wait :data:`SETTLE_S`, read back: the last writer keeps it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from search.errors import SearchError, causes, database_locked
from search.record.processes import named, proc, stop, tree
from search.record.storage import open_storage, rdb_backend

_log = logging.getLogger(__name__)

LEASE_ATTR = "driver"
TTL_S = float(os.environ.get("SEARCH_LEASE_TTL_S", "15"))
RENEW_S = TTL_S / 6
SETTLE_S = 1.0
LOCKED_NOTE_S = 30.0  # how often failing renewals (a locked database) say so
TAKEN_EXIT_STATUS = 3
"""The exit status of a ``run`` whose study another driver took over while it ran."""


class StudyBusyError(SearchError):
    """Another live driver holds the study."""


class StudyTakenError(SearchError):
    """Another driver took the study over from this one while it ran (it was paused, or cut
    off from the storage, for longer than the lease's expiry)."""


def new_run_id() -> str:
    """A unique id for one ``run`` of a study (recorded on the lease and on every trial)."""
    return uuid.uuid4().hex[:16]


def _boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return ""


def identity(run_id: str) -> dict[str, Any]:
    """This process as a lease holder."""
    pid, start = proc("self")
    return {
        "run": run_id,
        "host": socket.gethostname(),
        "boot": _boot_id(),
        "pid": pid or str(os.getpid()),
        "start": start,
        "ttl": TTL_S,
        "renewed": time.time(),
    }


def held(lease: dict[str, Any] | None, now: float | None = None) -> bool:
    """Whether ``lease`` is held: not released and renewed within :data:`TTL_S`."""
    if not lease or lease.get("released"):
        return False
    now = time.time() if now is None else now
    return now - float(lease.get("renewed", 0)) <= TTL_S


def holder_gone(lease: dict[str, Any]) -> bool:
    """Whether the holder ran on this machine and is verifiably gone: the machine rebooted
    since, or no process has its pid and start time any more."""
    if lease.get("host") != socket.gethostname() or not lease.get("boot"):
        return False  # another machine: only its renewals tell
    if lease["boot"] != _boot_id():
        return True
    return bool(lease.get("start")) and proc(lease.get("pid", "")) != (
        str(lease.get("pid")),
        lease["start"],
    )


def describe(lease: dict[str, Any]) -> str:
    """``run 3f2a... on host h (pid 12), renewed 4 s ago``."""
    age = max(0.0, time.time() - float(lease.get("renewed", 0)))
    return (
        f"run {lease.get('run')} on host {lease.get('host')} (pid {lease.get('pid')}), "
        f"renewed {age:.0f} s ago"
    )


class StudyLease:
    """The lease of one study for one run: :meth:`acquire`, renewed in a thread, :meth:`release`.

    Args:
        storage_url: The study's storage.
        study_name: The study.
        run_id: This run's id (:func:`new_run_id`).
    """

    def __init__(self, storage_url: str, study_name: str, run_id: str) -> None:
        self._storage = open_storage(storage_url)
        self._study_id = self._storage.get_study_id_from_name(study_name)
        self._name, self.run_id = study_name, run_id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing_since: float | None = None  # monotonic start of failed renewals
        self._noted_at: float | None = None  # when a failing renewal was last logged
        self._ray: list[int] = []  # the local Ray this driver started: its first processes
        self._lock = threading.Lock()  # one write of the lease at a time (renewal, keep)
        self._written: dict[str, Any] | None = None  # the lease as this run last wrote it
        self._lost = threading.Event()  # set once another driver is found holding it
        self._taken_by: dict[str, Any] = {}

    def current(self) -> dict[str, Any] | None:
        """The lease as stored (``None`` when the study never had one)."""
        value = self._storage.get_study_user_attrs(self._study_id).get(LEASE_ATTR)
        return value if isinstance(value, dict) else None

    def acquire(self, takeover: bool = False) -> dict[str, Any] | None:
        """Takes the lease; returns the previous holder's lease (``None``: there was none).

        Raises:
            StudyBusyError: When a live driver holds it (and ``takeover`` is False), or another
                driver took it at the same moment.
        """
        previous = self.current()
        why = None
        if previous and previous.get("run") != self.run_id and not previous.get("released"):
            previous, why = self._may_take(previous, takeover)
        taken = _swap(self._storage, self._study_id, previous, self._value())
        if taken is None:  # not an RDB storage: write, let a racing driver write, read back
            self._storage.set_study_user_attr(self._study_id, LEASE_ATTR, self._value())
            time.sleep(SETTLE_S)
            taken = self._mine(self.current())
        if not taken:
            raise StudyBusyError(
                f"study {self._name!r} was just taken by {describe(self.current() or {})}; "
                "one driver runs a study at a time"
            )
        self._written = self.current()
        if why and previous:
            _log.warning("taking study %r over from %s: %s", self._name, describe(previous), why)
        self._thread = threading.Thread(target=self._renew, name="search-lease", daemon=True)
        self._thread.start()
        if previous and not previous.get("released") and holder_gone(previous):
            self._stop_leftovers(previous)
        return previous

    def _may_take(
        self, previous: dict[str, Any], takeover: bool
    ) -> tuple[dict[str, Any] | None, str | None]:
        """Whether the unreleased lease ``previous`` may be taken (module docstring): the lease
        to replace, and why it may (``None``: it was released meanwhile).

        Raises:
            StudyBusyError: When its holder renewed it meanwhile.
        """
        if takeover:
            return previous, "--takeover"
        if self._gone(previous):
            return previous, "its driver is gone from this machine"
        expiry = max(TTL_S, float(previous.get("ttl") or 0))
        start = time.monotonic()
        while (waited := time.monotonic() - start) < expiry:
            time.sleep(min(expiry - waited, max(RENEW_S / 2, 0.05)))
            now = self.current()
            if now != previous:
                if now is None or now.get("released"):
                    return now, None
                raise StudyBusyError(
                    f"study {self._name!r} is being run by {describe(now)}; wait for it "
                    "to finish, stop it, or pass --takeover if that driver is dead"
                )
        return previous, (
            f"its lease went unrenewed for {expiry:.0f} s, as this driver's own clock measured"
        )

    @property
    def taken(self) -> bool:
        """Whether another driver took the study from this one (known without a read)."""
        return self._lost.is_set()

    def holds(self, read: bool = True) -> bool:
        """Whether this run still holds the study: read afresh from the storage (``read``),
        else as the last renewal or check found it. A storage that cannot be read says nothing
        (``True``): the renewals say why it fails."""
        if self._lost.is_set():
            return False
        if not read:
            return True
        try:
            now = self.current()
        except Exception:  # noqa: BLE001 - a storage hiccup is not a takeover
            return True
        if self._mine(now):
            return True
        self._lose(now)
        return False

    def taken_error(self) -> StudyTakenError:
        """The one line of a run whose study was taken over (:data:`TAKEN_EXIT_STATUS`)."""
        return StudyTakenError(
            f"study {self._name!r} was taken over by {describe(self._taken_by)}: this "
            "driver was paused or cut off from the storage past its lease's expiry; it "
            "stopped asking for trials and left its unfinished ones to that driver"
        )

    def keep(self, ray_pids: list[int]) -> None:
        """Records the processes of the local Ray this driver started (``ray_pids``, and
        what they start, on every renewal), for the next run to stop should this one die."""
        self._ray = list(ray_pids)
        self._write()

    def _stop_leftovers(self, previous: dict[str, Any]) -> None:
        """Stops the Ray processes a dead holder recorded that are still alive."""
        stopped = stop(previous.get("ray") or [], str(previous.get("run") or ""))
        if stopped:
            _log.warning(
                "stopped %d process%s of the local Ray that the dead run %s left on this machine",
                stopped,
                "" if stopped == 1 else "es",
                previous.get("run"),
            )

    def _gone(self, lease: dict[str, Any]) -> bool:
        """:func:`holder_gone`, and no renewal for two renewal periods (a pid seen through
        another container's ``/proc`` must not pass for a dead driver)."""
        if not holder_gone(lease):
            return False
        time.sleep(2 * RENEW_S)
        return (self.current() or {}).get("renewed") == lease.get("renewed")

    def release(self) -> None:
        """Stops renewing and marks the lease released (the next run need not wait); a lease
        another driver took is left as it is."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(Exception):
            self._write(released=time.time())

    def _mine(self, lease: dict[str, Any] | None) -> bool:
        """Whether ``lease`` is this run's, unreleased."""
        return lease is not None and lease.get("run") == self.run_id and not lease.get("released")

    def _lose(self, now: dict[str, Any] | None) -> None:
        self._taken_by = now or {}
        self._lost.set()

    def _value(self, **extra: Any) -> dict[str, Any]:
        ray = {"ray": named(tree(self._ray))} if self._ray else {}
        return {**identity(self.run_id), **ray, **extra}

    def _write(self, **extra: Any) -> bool:
        """Writes the lease if it is still the one this run last wrote (a compare-and-set);
        ``False`` when another driver took it (then never written again)."""
        with self._lock:
            if self._lost.is_set():
                return False
            value = self._value(**extra)
            done = _swap(self._storage, self._study_id, self._written, value)
            if not done:  # another driver's, or this run's own write that seemed to fail
                now = self.current()
                if not self._mine(now):
                    self._lose(now)
                    return False
                if done is None:  # not an RDB storage: a plain write
                    self._storage.set_study_user_attr(self._study_id, LEASE_ATTR, value)
                elif not _swap(self._storage, self._study_id, now, value):
                    raise RuntimeError("the lease changed while it was renewed")
            self._written = value
            return True

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S):
            started = time.monotonic()
            try:
                if not self._write():  # taken over: never written back; the run stops
                    return
            except Exception as exc:  # a storage hiccup: the next renewal may pass
                self._renewal_failed(exc, started)
            else:
                self._renewed()

    def _renewal_failed(self, exc: Exception, started: float) -> None:
        """Says why renewals fail, at most every :data:`LOCKED_NOTE_S`: how long the database
        has been locked, or the error behind Optuna's generic commit message."""
        if self._failing_since is None:
            self._failing_since = started
        if self._noted_at is not None and time.monotonic() - self._noted_at < LOCKED_NOTE_S:
            return
        self._noted_at = time.monotonic()
        if database_locked(exc):
            _log.warning(
                "the study's database was locked for %.0f s; the lease is renewed when it frees",
                self._noted_at - self._failing_since,
            )
        else:
            _log.warning("renewing the study lease failed: %s", causes(exc)[-1])

    def _renewed(self) -> None:
        """After failed renewals, one line saying the lease is renewed again."""
        if self._failing_since is not None:
            _log.warning(
                "the study's lease is renewed again, after %.0f s",
                time.monotonic() - self._failing_since,
            )
        self._failing_since = self._noted_at = None


def _swap(
    storage: Any, study_id: int, expected: dict[str, Any] | None, value: dict[str, Any]
) -> bool | None:
    """Writes the lease ``value`` if the stored lease is still ``expected`` (``None``: no
    lease), in one transaction: ``True`` when written, ``False`` when another driver wrote
    first; ``None`` when ``storage`` is not an RDB storage (nothing written).

    The write is a conditional ``UPDATE`` on the stored JSON (or an ``INSERT`` that the table's
    unique ``(study_id, key)`` refuses to a second driver), atomic on SQLite and PostgreSQL
    alike; Optuna has no conditional write, hence its table directly (as
    :mod:`search.record.bulk` reads it)."""
    from optuna.storages import RDBStorage

    backend = rdb_backend(storage)
    if not isinstance(backend, RDBStorage):
        return None
    import sqlalchemy as sa
    from optuna.storages._rdb import models

    table = models.StudyUserAttributeModel.__table__
    mine = (table.c.study_id == study_id) & (table.c.key == LEASE_ATTR)
    try:
        with backend.engine.begin() as conn:
            stored = conn.execute(sa.select(table.c.value_json).where(mine)).scalar()
            now = json.loads(stored) if stored is not None else None
            if (now if isinstance(now, dict) else None) != expected:
                return False
            if stored is None:
                row = {"study_id": study_id, "key": LEASE_ATTR, "value_json": json.dumps(value)}
                conn.execute(sa.insert(table).values(**row))
                return True
            done = conn.execute(
                sa.update(table)
                .where(mine & (table.c.value_json == stored))
                .values(value_json=json.dumps(value))
            )
            return done.rowcount == 1
    except sa.exc.IntegrityError:  # the other driver inserted the first lease
        return False
