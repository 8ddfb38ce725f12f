"""SIGTERM to the driver, as Kubernetes and Slurm send it, ends a run the way Ctrl-C does.

While Tune runs the trials, :meth:`Termination.watch` replaces Ray's SIGTERM handler (set by
``ray.init``: ``sys.exit`` from wherever the main thread is, with no summary) with one that
settles every running trial at once and leaves Tune's loop, so the run ends as after Ctrl-C:
every fate written, the summary printed, then exit status 143 (``128 + SIGTERM``, what a
shell reports for a process SIGTERM ended). A trial the signal cut
is not the user's doing: it ends FAIL with :data:`search.record.resume.INTERRUPTED` and is
replaced by the next run of the study, as after ``kill -9`` of the driver.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

EXIT_STATUS = 128 + signal.SIGTERM
"""The exit status of a run SIGTERM stopped."""


class Termination:
    """Whether the run got SIGTERM; :meth:`watch` handles it meanwhile.

    The handler settles the trials first (``on_signal``), then raises ``KeyboardInterrupt`` in
    the main thread, out of Tune's loop: it does not wait for Tune to stop its trials, which
    needs Ray, and Slurm's SIGTERM to the process group ends the local Ray's processes too.

    Args:
        on_signal: Called once, in the main thread, when SIGTERM arrives; settable after
            construction.
    """

    def __init__(self, on_signal: Callable[[], None] = lambda: None) -> None:
        self.received = False
        self.on_signal = on_signal

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first, self.received = not self.received, True
        if first:
            self.on_signal()
        interrupt = signal.getsignal(signal.SIGINT)  # Tune's while it runs, else Python's
        if callable(interrupt) and interrupt is not signal.default_int_handler:
            interrupt(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def watch(self) -> Iterator[Termination]:
        """Handles SIGTERM as Ctrl-C inside the block (main thread only; elsewhere a no-op),
        then puts the earlier handler back."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        earlier = signal.signal(signal.SIGTERM, self._handle)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, earlier)
