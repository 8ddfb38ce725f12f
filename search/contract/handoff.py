"""A framework's own fit loop in a thread, handing each epoch to the trial's generator.

``model.fit`` (Keras), ``trainer.fit`` (Lightning) and ``trainer.train`` (Hugging Face) each
run all epochs in one call, while a trainable yields one epoch at a time. :class:`Handoff`
bridges the two with two queues: at each epoch end the fit thread hands the metrics out with
:meth:`Handoff.hand` and waits, like a generator paused at its yield; :func:`drive` starts the
thread and yields what it hands out. The adapters (``search.keras``, ``search.lightning``,
``search.hf``) add only their framework's callback and stop flag.

Example:
    >>> handoff = Handoff()
    >>> def fit() -> None:
    ...     for epoch in range(1, 4):
    ...         if not handoff.hand({"epoch": float(epoch)}):
    ...             return
    >>> list(drive(handoff, fit, "doctest-fit", stop=lambda: None))
    [{'epoch': 1.0}, {'epoch': 2.0}, {'epoch': 3.0}]
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

from search.contract.context import Metrics


class Handoff:
    """The two queues between the fit thread and the trial's generator."""

    def __init__(self) -> None:
        self.events: queue.Queue[tuple[str, object]] = queue.Queue()  # fit thread -> caller
        self.resume: queue.Queue[bool] = queue.Queue()  # caller -> fit thread: go on?

    def run(self, fit: Callable[[], object]) -> None:
        """The fit thread: ``fit()``, then ``done`` (or the ``error`` it raised)."""
        try:
            fit()
        except BaseException as error:  # re-raised in the caller
            self.events.put(("error", error))
        else:
            self.events.put(("done", None))

    def hand(self, metrics: Metrics) -> bool:
        """From the fit thread: hands ``metrics`` out and waits; False when the trial stops."""
        self.events.put(("epoch", metrics))
        return self.resume.get()

    def epochs(self) -> Iterator[Metrics]:
        """The caller's side: each epoch's metrics until ``fit`` returns or raises."""
        while True:
            kind, payload = self.events.get()
            if kind == "error":
                assert isinstance(payload, BaseException)
                raise payload
            if kind == "done":
                return
            assert isinstance(payload, dict)
            yield payload
            self.resume.put(True)

    def release(self) -> None:
        """Lets a waiting :meth:`hand` return False."""
        self.resume.put(False)


def drive(
    handoff: Handoff, fit: Callable[[], object], name: str, stop: Callable[[], None]
) -> Iterator[Metrics]:
    """Runs ``fit`` in a thread named ``name`` and yields each epoch it hands out.

    When the caller stops early (ASHA's prune closes the generator) or ``fit`` ends,
    ``stop()`` sets the framework's own stop flag, a waiting hand-off is released and the
    thread is joined, so no training outlives the trial.
    """
    thread = threading.Thread(target=handoff.run, args=(fit,), name=name, daemon=True)
    thread.start()
    try:
        yield from handoff.epochs()
    finally:
        stop()
        handoff.release()
        thread.join()
