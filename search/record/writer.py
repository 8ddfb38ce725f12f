"""One background thread that commits trial writes in the order they were made.

:class:`~search.record.writeback.WriteBehindStorage` hands its trial writes (attributes,
intermediate values, parameters) to an :class:`OrderedWriter` so that Tune's loop does not wait
for them. The writer commits what has queued up since its last commit in one transaction
(:func:`~search.record.batch.write_together`); a batch that fails is written again one by one,
so only its bad writes fail. Each failure is logged, counted for its trial (a trial with a
failed write must not be told finished) and raised by :meth:`OrderedWriter.close`: a write is
never dropped silently.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from optuna.storages import BaseStorage

from search.errors import causes, disk_full
from search.record.batch import Known, write_together
from search.record.outage import Outage

_log = logging.getLogger(__name__)

_STOP = object()

BATCH_LIMIT = 500
"""Most queued writes committed in one transaction."""

Op = tuple[int, str, tuple[Any, ...]]
"""A queued write of one trial: ``(sequence number, storage method, its arguments after the
trial id)``."""


class OrderedWriter:
    """Commits writes to ``storage`` on a background thread, in order, several at a time.

    Args:
        storage: The storage written (for SQLite and PostgreSQL, several writes a transaction).

    Example:
        >>> import optuna
        >>> study = optuna.create_study()
        >>> trial = study.ask()
        >>> writer = OrderedWriter(study._storage)
        >>> writer.put(trial._trial_id, "set_trial_user_attr", ("device", "cpu"))
        >>> writer.close()
        >>> study.trials[0].user_attrs
        {'device': 'cpu'}
    """

    def __init__(self, storage: BaseStorage, outage: Outage | None = None) -> None:
        self._storage = storage
        self._outage = outage or Outage()  # a database that stops answering: tried again
        self._queue: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self._pending: dict[int, list[Op]] = {}
        self._seq = 0
        self._errors: list[BaseException] = []
        self._disk_full_said = False  # a full disk fails every write: said once
        self._failed: dict[int, int] = {}  # trial id -> its writes that failed
        self._thread: threading.Thread | None = None
        self._known: Known = {}  # each parameter's distribution, read once (batch.py)

    def put(self, trial_id: int, method: str, args: tuple[Any, ...]) -> None:
        """Queues ``storage.<method>(trial_id, *args)``."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._drain, name="search-writeback", daemon=True
                )
                self._thread.start()
            self._seq += 1
            self._pending.setdefault(trial_id, []).append((self._seq, method, args))
            self._queue.put((self._seq, trial_id, method, args))

    def pending(self) -> dict[int, list[Op]]:
        """The writes queued and not yet committed, by trial."""
        with self._lock:
            return {trial_id: list(ops) for trial_id, ops in self._pending.items()}

    def failed(self, trial_id: int) -> tuple[int, BaseException | None]:
        """How many writes of the trial failed, and the latest error of any write."""
        with self._lock:
            return self._failed.get(trial_id, 0), (self._errors[-1] if self._errors else None)

    def flush(self) -> None:
        """Waits until every queued write is committed (or has failed)."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        """Flushes, stops the thread and raises the first error a write met."""
        self.flush()
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None
        if self._errors:
            first = self._errors[0]
            raise RuntimeError(
                f"{len(self._errors)} study write(s) failed; first: {type(first).__name__}: {first}"
            ) from first

    def _drain(self) -> None:
        while True:
            items = [self._queue.get()]
            while len(items) < BATCH_LIMIT and items[-1] is not _STOP:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._commit([item for item in items if item is not _STOP])
            finally:
                for _ in items:
                    self._queue.task_done()
            if items[-1] is _STOP:
                return

    def _commit(self, items: list[tuple[int, int, str, tuple[Any, ...]]]) -> None:
        """Commits ``items`` together, or one by one when the storage cannot or the batch
        failed, to find the writes that fail."""
        writes = [item[1:] for item in items]
        try:
            together = self._outage.call(write_together, self._storage, writes, self._known)
        except Exception:  # one of them fails: one by one tells which
            together = False
        for seq, trial_id, method, args in items:
            if not together:
                try:
                    self._outage.call(getattr(self._storage, method), trial_id, *args)
                except BaseException as exc:  # kept, raised by close(); the loop goes on
                    self._warn(method, trial_id, exc)
                    with self._lock:
                        self._errors.append(exc)
                        self._failed[trial_id] = self._failed.get(trial_id, 0) + 1
            with self._lock:
                ops = self._pending.get(trial_id, [])
                ops[:] = [op for op in ops if op[0] != seq]
                if not ops:
                    self._pending.pop(trial_id, None)

    def _warn(self, method: str, trial_id: int, exc: BaseException) -> None:
        """Logs a failed write with its cause (Optuna's own says "invalid data in the
        commit"); of the writes a full disk fails, the first only."""
        if disk_full(exc) is not None:
            if self._disk_full_said:
                return
            self._disk_full_said = True
        _log.warning("storage write %s(trial %s) failed: %s", method, trial_id, causes(exc)[-1])
