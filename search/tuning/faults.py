"""A full disk met while trials run stops the run, and cuts no trial's budget.

A trial whose checkpoint, output or traceback meets ``ENOSPC`` (``--results`` full while the
study's disk has room), or Tune's experiment state the driver syncs into ``--results``, is
no fault of the config: retrying it fills nothing, and every trial after it would fail the
same way and use up the budget. So the first full disk a run meets settles every running
trial at once as cut by the world (:data:`search.tuning.fate.DISK_FULL`: FAIL ``interrupted``,
replaced by the next run), stops Tune, and ends the command in one line, exit status 2
(:class:`search.errors.DiskFullError`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from search.errors import DiskFullError, disk_full
from search.record.storage import full_disk_error

SYNC_LOGGERS = ("ray.train._internal.syncer", "ray.train._internal.storage")
"""Where Ray logs (as a warning with its traceback, every sync) that the driver could not
write Tune's experiment state into the run's folder."""


class DiskFault:
    """The first full disk the run met, and what to do then.

    Args:
        on_fault: Called once, with the Ray trial id whose error it was (``None`` when the
            driver met it), when the first full disk is met.

    Example:
        >>> cut = []
        >>> fault = DiskFault(cut.append)
        >>> fault.met(OSError(28, "No space left on device"), "t1"), fault.met(ValueError())
        (True, False)
        >>> cut, fault.where
        (['t1'], '')
    """

    def __init__(self, on_fault: Callable[[str | None], None] = lambda trial_id: None) -> None:
        self.on_fault = on_fault
        self.where: str | None = None
        """The file the first full disk's error named (``""``: none); ``None`` until then."""
        self.error: BaseException | None = None

    def met(self, error: BaseException | None, trial_id: str | None = None) -> bool:
        """Whether ``error`` is a full disk; the first one settles the run (``on_fault``)."""
        where = disk_full(error) if error is not None else None
        if where is None:
            return False
        if self.where is None:
            self.where, self.error = where, error
            self.on_fault(trial_id)
        return True

    @property
    def verdict(self) -> str | None:
        """Why the run must stop now (``None``: no full disk met)."""
        return None if self.where is None else "no space left on device"

    def raise_if_met(self, places: Sequence[str]) -> None:
        """Raises the one line for the full disk met, naming the file its error named or the
        first of ``places`` (the results folder, the storage URL) whose filesystem is full."""
        if self.error is not None:
            raise full_disk_error(self.error, list(places)) or DiskFullError(places[0])

    def filter(self, record: logging.LogRecord) -> bool:
        """A logging filter: drops Ray's warning that the driver's sync met a full disk, and
        settles the run on it; keeps every other record."""
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += str(record.exc_info[1])
        return not self.met(RuntimeError(text))

    @contextmanager
    def watching_ray_logs(self) -> Iterator[DiskFault]:
        """Applies :meth:`filter` to Ray's sync loggers inside the block."""
        loggers = [logging.getLogger(name) for name in SYNC_LOGGERS]
        for logger in loggers:
            logger.addFilter(self.filter)
        try:
            yield self
        finally:
            for logger in loggers:
                logger.removeFilter(self.filter)
