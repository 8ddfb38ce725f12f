"""SIGTERM (Kubernetes, Slurm) and Ctrl-C while Tune runs: the handler sets a flag, the run's
loop does the rest.

A signal handler runs in the main thread between two bytecodes of whatever it was doing, maybe
in the middle of a storage transaction: a handler that wrote to the study there waited for the
very lock the interrupted transaction held (SQLite's, or the write-behind queue's), or wrote
through that transaction's own session. So :meth:`Termination.watch` installs handlers that
only record the signal and return; Tune's loop calls :meth:`Termination.act` on every step
(through the run's stopper, :mod:`search.tuning.fit`), and that call, outside any handler, settles
the running trials and stops the run. Then the run records every fate, prints its summary and
exits:

* SIGTERM: exit status :data:`EXIT_STATUS` (143, ``128 + SIGTERM``, what a shell reports for a
  process SIGTERM ended). A trial it cut is not the user's doing: it ends FAIL with
  :data:`search.record.resume.INTERRUPTED` and is replaced by the next run of the study, as
  after ``kill -9`` of the driver.
* Ctrl-C (SIGINT): one line at once, then exit status :data:`INTERRUPT_EXIT_STATUS` (130,
  ``128 + SIGINT``). A trial it cut is the user's doing: PRUNED with ``stopped_by: interrupt``
  after an epoch, FAIL before. A second Ctrl-C cuts at once: ``KeyboardInterrupt`` out of
  Tune's loop, without waiting for Tune to stop its trials; every fate is still written.

Tune's own SIGINT handler (which would end its loop without our cut) is kept out meanwhile
(``TUNE_DISABLE_SIGINT_HANDLER``), and so is Ray's SIGTERM handler (set by ``ray.init``:
``sys.exit`` from wherever the main thread is, with no summary).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

EXIT_STATUS = 128 + signal.SIGTERM
"""The exit status of a run SIGTERM stopped."""
INTERRUPT_EXIT_STATUS = 128 + signal.SIGINT
"""The exit status of a run Ctrl-C stopped."""
INTERRUPT_LINE = "Ctrl-C: stopping; the running trials are cut (Ctrl-C again stops at once)"
"""The line a first Ctrl-C prints."""
_TUNE_SIGINT = "TUNE_DISABLE_SIGINT_HANDLER"


class Termination:
    """Whether the run got SIGTERM or Ctrl-C; :meth:`watch` records them meanwhile, and
    :meth:`act`, called from the run's loop, acts on them.

    Args:
        on_signal: Called once, by :meth:`act`, after SIGTERM; settable after construction.
        on_interrupt: Called once, by :meth:`act`, after Ctrl-C; settable after construction.
    """

    def __init__(
        self,
        on_signal: Callable[[], None] = lambda: None,
        on_interrupt: Callable[[], None] = lambda: None,
    ) -> None:
        self.received = False
        """Whether SIGTERM arrived."""
        self.interrupted = False
        """Whether Ctrl-C arrived."""
        self.on_signal = on_signal
        self.on_interrupt = on_interrupt
        self._acted: set[str] = set()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        """Records the signal and returns; only a second Ctrl-C raises (at once)."""
        if signum == signal.SIGINT:
            if self.interrupted:
                raise KeyboardInterrupt
            self.interrupted = True
        else:
            self.received = True

    def act(self) -> str | None:
        """In the run's loop (never in a handler): the first time after each signal, calls
        its callback; returns what stopped the run (``"SIGTERM"``, ``"interrupt"``) or
        ``None``."""
        if self.received and "SIGTERM" not in self._acted:
            self._acted.add("SIGTERM")
            self.on_signal()
        if self.interrupted and "interrupt" not in self._acted:
            self._acted.add("interrupt")
            print(INTERRUPT_LINE, file=sys.stderr, flush=True)
            self.on_interrupt()
        return "SIGTERM" if self.received else "interrupt" if self.interrupted else None

    @contextlib.contextmanager
    def watch(self) -> Iterator[Termination]:
        """Records SIGTERM and SIGINT inside the block (main thread only; elsewhere a no-op),
        then puts the earlier handlers back."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        earlier = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
        tune_sigint = os.environ.get(_TUNE_SIGINT)
        os.environ[_TUNE_SIGINT] = "1"
        try:
            yield self
        finally:
            if tune_sigint is None:
                os.environ.pop(_TUNE_SIGINT, None)
            else:
                os.environ[_TUNE_SIGINT] = tune_sigint
            for sig, handler in earlier.items():
                signal.signal(sig, handler)
