"""An Optuna storage wrapper whose trial writes do not stall Ray Tune's loop.

The bridge runs inside Tune's controller loop: every parameter it samples and every
``set_user_attr``, ``report`` and ``tell`` it makes is a storage commit, and on SQLite each
commit waits for the disk (about 9 commits per trial, and 9 more for the cnn space's
parameters). While it waits, no trial starts, no result is read.
:class:`WriteBehindStorage` queues those writes and one background thread commits them, in the
order they were made (:mod:`search.record.writer`); everything else (creating a trial, every
read) goes straight to the wrapped storage. A driver killed between a trial's ``ask`` and the
queue's next commit leaves that trial RUNNING without its parameters; the next run marks it
FAIL, as it would with them.

The one write that waits is a trial's final state: it is written through, after everything
queued before it, so ``tell`` returns only once it is committed (a driver killed right after
loses no finished trial) and raises at once when it, or a queued write of that trial, failed.
Reads stay consistent for the driver: a read of a trial with writes still queued returns the
trial with those writes applied (an overlay), so ``tell`` of a PRUNED trial still sees its last
intermediate value and the sampler sees a finished trial as finished. A trial this driver
created is only ever written by this driver, so until it finishes ``get_trial`` answers from a
local copy kept up to date by those writes (no query). Other readers (the dashboard, ``search
trials``) see each write a few milliseconds later. :meth:`flush` waits for the queue; the
runner calls :meth:`close` before it returns, which flushes and raises the first error a
background write met (a write is never dropped silently).

On SQLite (WAL mode) the wrapper also sets ``synchronous=NORMAL`` on its connections: a commit
then no longer waits for the disk; a crash of the process loses nothing committed, a power
loss may lose the last commits, the same trade the write-behind queue makes.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Container, Sequence
from datetime import datetime
from typing import Any

from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.study._frozen import FrozenStudy
from optuna.trial import FrozenTrial, TrialState

from search.record.batch import relax_sqlite_sync
from search.record.outage import Outage
from search.record.writer import Op, OrderedWriter

VIEW_EVERY_S = 2.0
"""Most seconds :meth:`WriteBehindStorage.get_all_trials` reuses its view of the storage."""


class WriteBehindStorage(BaseStorage):
    """Wraps ``inner``; trial attributes, intermediate values and final states are written by a
    background thread, in order.

    Args:
        inner: The storage to write to (for SQLite and PostgreSQL, Optuna's cached RDB storage).

    Example:
        >>> import optuna
        >>> storage = WriteBehindStorage(optuna.storages.InMemoryStorage())
        >>> study = optuna.create_study(storage=storage)
        >>> trial = study.ask()
        >>> trial.set_user_attr("device", "cpu")
        >>> _ = study.tell(trial, 1.0)
        >>> storage.close()
        >>> study.trials[0].user_attrs, study.trials[0].state.name
        ({'device': 'cpu'}, 'COMPLETE')
    """

    def __init__(self, inner: BaseStorage) -> None:
        self.inner = inner
        self.outage = Outage()
        """Tries a call again while the database does not answer (:mod:`search.record.outage`)."""
        self._writer = OrderedWriter(inner, self.outage)
        self._lock = threading.Lock()
        self._closed = False
        self._own: dict[int, FrozenTrial | None] = {}  # trials created here, until finished
        self._mine: dict[int, int] = {}  # trial id -> study id, for trials created here
        self._told: dict[int, FrozenTrial] = {}  # created here, finished since the last view
        self._view: tuple[int, float, list[FrozenTrial], dict[int, int]] | None = None
        relax_sqlite_sync(inner)

    # ---- the writer: its queue and its thread (search/record/writer.py) ---------------------

    def _defer(self, trial_id: int, method: str, *args: Any) -> None:
        if self._closed:  # after close, write through
            getattr(self.inner, method)(trial_id, *args)
            return
        with self._lock:
            if trial_id in self._own:  # the local copy takes every write to an own trial
                local = self._own[trial_id]
                if method == "set_trial_state_values" or local is None:
                    self._own.pop(trial_id)  # finished: reads go to the storage (and overlay)
                else:  # a new object: a trial read before (deepcopy=False) stays as it was
                    self._own[trial_id] = self._apply(copy.copy(local), [(0, method, args)])
            self._writer.put(trial_id, method, args)

    def flush(self) -> None:
        """Waits until every queued write is committed."""
        self._writer.flush()

    def close(self) -> None:
        """Flushes, stops the writer thread and raises the first error a write met; later
        writes go straight through."""
        try:
            self._writer.close()
        finally:
            self._closed = True

    # ---- the overlay: reads see the queued writes ------------------------------------------

    def _snapshot(self) -> dict[int, list[Op]]:
        """The queued writes, taken *before* a read of the storage: a write that lands during
        the read is then applied twice (harmless: every write is idempotent), never lost."""
        return self._writer.pending()

    def _overlay(self, trial: FrozenTrial, pending: dict[int, list[Op]]) -> FrozenTrial:
        ops = pending.get(trial._trial_id)
        if not ops:
            return trial
        return self._apply(copy.deepcopy(trial), ops)

    @staticmethod
    def _apply(trial: FrozenTrial, ops: Sequence[Op]) -> FrozenTrial:
        """Applies queued writes to ``trial`` (and returns it), each dict it changes replaced
        by a new one: a shallow copy of a trial takes them and leaves the original as it was."""
        for _, method, args in ops:
            if method == "set_trial_user_attr":
                trial.user_attrs = {**trial.user_attrs, args[0]: args[1]}
            elif method == "set_trial_system_attr":
                trial.system_attrs = {**trial.system_attrs, args[0]: args[1]}
            elif method == "set_trial_intermediate_value":
                trial.intermediate_values = {**trial.intermediate_values, args[0]: args[1]}
            elif method == "set_trial_param":
                name, internal, distribution = args
                trial.params = {**trial.params, name: distribution.to_external_repr(internal)}
                trial.distributions = {**trial.distributions, name: distribution}
            elif method == "set_trial_state_values":
                trial.state = args[0]
                trial.values = list(args[1]) if args[1] is not None else None
        return trial

    # ---- deferred writes --------------------------------------------------------------------

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._defer(trial_id, "set_trial_user_attr", key, value)

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._defer(trial_id, "set_trial_system_attr", key, value)

    def set_trial_intermediate_value(
        self, trial_id: int, step: int, intermediate_value: float
    ) -> None:
        self._defer(trial_id, "set_trial_intermediate_value", step, intermediate_value)

    def set_trial_param(
        self, trial_id: int, param_name: str, param_value_internal: float, distribution: Any
    ) -> None:
        """Deferred too: one commit per parameter was half of an ``ask`` at 10,000 trials.
        Its distribution is still checked against the study's earlier ones, as Optuna does
        (:mod:`search.record.batch`; a resumed run with a changed space is refused before any
        trial: ``SpecMismatchError``)."""
        self._defer(trial_id, "set_trial_param", param_name, param_value_internal, distribution)

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        """Not deferred: WAITING -> RUNNING must know whether it won the trial, and a finished
        state is written through, after the trial's queued writes, so ``tell`` returns once the
        fate is durable and raises at once if it could not be written (a driver killed a
        moment later loses no finished trial; its epochs may lag, its fate may not)."""
        self.flush()
        failed, error = self._writer.failed(trial_id)
        if failed:
            raise RuntimeError(
                f"trial {trial_id}: {failed} earlier write(s) failed; its state "
                f"is not written: {error}"
            ) from error
        with self._lock:
            local = self._own.pop(trial_id, None)
        won = self.outage.call(self.inner.set_trial_state_values, trial_id, state, values)
        if trial_id in self._mine and state.is_finished():
            told = (
                copy.deepcopy(local)
                if local is not None
                else self.outage.call(self.inner.get_trial, trial_id)
            )
            told.state, told.datetime_complete = state, datetime.now()
            told.values = list(values) if values is not None else None
            with self._lock:
                self._told[trial_id] = told
        return won

    # ---- straight through -------------------------------------------------------------------

    def create_new_study(
        self, directions: Sequence[StudyDirection], study_name: str | None = None
    ) -> int:
        return self.outage.call(self.inner.create_new_study, directions, study_name)

    def delete_study(self, study_id: int) -> None:
        self.flush()
        self.outage.call(self.inner.delete_study, study_id)
        with self._lock:  # its trials go with it, and the view (a new study may take its id)
            for trial_id in [t for t, s in self._mine.items() if s == study_id]:
                self._mine.pop(trial_id)
                self._told.pop(trial_id, None)
                self._own.pop(trial_id, None)
            self._view = None

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self.outage.call(self.inner.set_study_user_attr, study_id, key, value)

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self.outage.call(self.inner.set_study_system_attr, study_id, key, value)

    def get_study_id_from_name(self, study_name: str) -> int:
        return self.outage.call(self.inner.get_study_id_from_name, study_name)

    def get_study_name_from_id(self, study_id: int) -> str:
        return self.outage.call(self.inner.get_study_name_from_id, study_id)

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return self.outage.call(self.inner.get_study_directions, study_id)

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self.outage.call(self.inner.get_study_user_attrs, study_id)

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self.outage.call(self.inner.get_study_system_attrs, study_id)

    def get_all_studies(self) -> list[FrozenStudy]:
        return self.outage.call(self.inner.get_all_studies)

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        trial_id = self.outage.call(self.inner.create_new_trial, study_id, template_trial)
        born = self._born(trial_id, template_trial)
        with self._lock:
            self._own[trial_id] = born  # None: fetched once, on first read
            self._mine[trial_id] = study_id
        return trial_id

    def _born(self, trial_id: int, template: FrozenTrial | None) -> FrozenTrial | None:
        """The trial just created from ``template``, as stored, without reading it back: the
        template with its id and number (from Optuna's cache, which assigned it); ``None``
        without a template or that cache."""
        numbers = getattr(self.inner, "_trial_id_to_study_id_and_number", None)
        if template is None or not isinstance(numbers, dict) or trial_id not in numbers:
            return None
        born = copy.deepcopy(template)
        born.number, born._trial_id = numbers[trial_id][1], trial_id
        return born

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        return self.outage.call(
            self.inner.get_trial_id_from_study_id_trial_number, study_id, trial_number
        )

    def get_trial(self, trial_id: int) -> FrozenTrial:
        trial, local = self._read(trial_id)
        return copy.deepcopy(trial) if local else trial

    def _read(self, trial_id: int) -> tuple[FrozenTrial, bool]:
        """The trial with every write made here, and whether that is its local copy (which
        later writes change in place: :meth:`get_trial` hands out copies of it)."""
        pending = self._snapshot()
        with self._lock:
            own = trial_id in self._own
            local = self._own.get(trial_id)
            told = self._told.get(trial_id)
        if told is not None and trial_id not in pending:  # as told here: ``tell`` reads it
            return told, True
        if local is None:
            local = self.outage.call(self.inner.get_trial, trial_id)
            if not own or local.state.is_finished() or trial_id in pending:
                return self._overlay(local, pending), False
            with self._lock:
                if trial_id in self._own:
                    self._own[trial_id] = local
        return local, True  # the local copy already holds every write

    def get_all_trials(
        self,
        study_id: int,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
    ) -> list[FrozenTrial]:
        """Every trial of the study: the trials created here from their local copies, the
        others from a view of the storage read at most every :data:`VIEW_EVERY_S`.

        The sampler reads all trials on every ask; read from the storage each time (Optuna's
        cache re-reads every unfinished trial), that cost grew with the trials running. Only
        the trials of other drivers (a shared study) can be stale, by at most that long."""
        pending = self._snapshot()
        base, index = self._base(study_id)
        with self._lock:
            mine = {tid for tid, sid in self._mine.items() if sid == study_id}
            told = dict(self._told)
        trials = list(base)
        for trial_id in mine | set(told) | set(pending):  # the few this driver changed
            if trial_id in index:
                trials[index[trial_id]] = self._current(base[index[trial_id]], mine, told, pending)
        for trial_id in sorted(mine - set(index)):  # created here since the view was read
            trials.append(told.get(trial_id) or self._read(trial_id)[0])
        if states is not None:
            trials = [t for t in trials if t.state in states]
        return copy.deepcopy(trials) if deepcopy else trials

    def _base(self, study_id: int) -> tuple[list[FrozenTrial], dict[int, int]]:
        """The view of the storage, read again when older than :data:`VIEW_EVERY_S`, and each
        trial's place in it."""
        now = time.monotonic()
        if self._view is None or self._view[0] != study_id or now - self._view[1] > VIEW_EVERY_S:
            base = self.outage.call(self.inner.get_all_trials, study_id, False)
            stored = {t._trial_id for t in base if t.state.is_finished()}
            with self._lock:
                for trial_id in stored & set(self._told):
                    self._mine.pop(trial_id, None)
                    self._told.pop(trial_id)
            index = {t._trial_id: i for i, t in enumerate(base)}
            self._view = (study_id, now, base, index)
        return self._view[2], self._view[3]

    def _current(
        self,
        trial: FrozenTrial,
        mine: set[int],
        told: dict[int, FrozenTrial],
        pending: dict[int, list[Op]],
    ) -> FrozenTrial:
        """``trial`` as this driver knows it now (the view may predate its latest writes)."""
        trial_id = trial._trial_id
        if trial_id in told:
            return told[trial_id]
        if trial_id in mine and not trial.state.is_finished():
            return self._read(trial_id)[0]
        return self._overlay(trial, pending)

    def remove_session(self) -> None:
        self.inner.remove_session()

    def check_trial_is_updatable(self, trial_id: int, trial_state: TrialState) -> None:
        self.outage.call(self.inner.check_trial_is_updatable, trial_id, trial_state)
