"""A trial whose process died: what ended it, at which epoch, and whether to try it again.

Ray reports a dead worker as an ``ActorDiedError`` of some 600 characters that names neither
the signal nor the exit code ("Worker unexpectedly exits with a connection error code 2. End
of file. Some common causes include ..."): the raylet only sees the worker's socket close.
The worker's own output says more, and it is in the trial's ``output.log``
(:mod:`search.tuning.output`): on a fatal signal Python's faulthandler writes ``Fatal Python
error: Segmentation fault`` and the stack, and Ray's own handler ``*** SIGSEGV received``;
an ``os._exit`` during a trial writes :data:`EXIT_NOTE` first (:func:`exit_noted`). So the
driver reads what the dead attempt wrote to its log, and the trial fails with
``worker died: SIGSEGV (Segmentation fault) at epoch 2`` or
``worker exited with code 3 at epoch 2``. A log that says nothing of the end means a signal
no process can catch: ``worker killed without a word (SIGKILL, or the kernel's OOM killer)``
(:data:`SILENT`). A log the driver cannot read (a trial on another node) leaves ``worker died
at epoch 2`` with the first sentence of Ray's exit detail. A trial whose node died was cut by
the world, not by its code: it is interrupted (:func:`node_lost`), like a trial of a dead
driver, and replaced by the next run.

Retries: a worker that died is retried (``faults.max_failures``), but that retry must get
past the epoch where the worker died before it earns another: a retry that fails again at
or before that epoch ends the trial. A crash that repeats at the same epoch (a segfault in
the code, an ``os._exit`` of a library) fails every retry alike; a transient one (a node
lost, a worker killed once) is behind the retry by then.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from search.tuning.fate import EPOCH

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

EXIT_NOTE = "search: the trial's process exits with code {code}"
"""Written to the trial's log by an ``os._exit`` during the trial (:func:`exit_noted`)."""

FAULTS = {
    "Segmentation fault": "SIGSEGV",
    "Floating-point exception": "SIGFPE",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Illegal instruction": "SIGILL",
}
"""faulthandler's words for the signals it reports (``Fatal Python error: <words>``)."""

_MARKS = re.compile(
    r"Fatal Python error: (?P<fault>[A-Za-z -]+?)\s*$"
    r"|\*\*\* (?P<signal>SIG[A-Z0-9]+) received"
    r"|" + re.escape(EXIT_NOTE).replace(r"\{code\}", r"(?P<code>-?\d+)"),
    re.MULTILINE,
)
TAIL_BYTES = 1 << 16
"""How much of a dead attempt's log is read for its cause."""


def _signal_cause(name: str) -> str:
    """``SIGSEGV (Segmentation fault)``."""
    with contextlib.suppress(KeyError, ValueError):
        words = signal.strsignal(signal.Signals[name])
        return f"{name} ({words})" if words else name
    return name


def cause_in(text: str) -> str | None:
    """What ended a worker, from the output it wrote last; ``None`` when it does not say.

    Example:
        >>> cause_in("*** SIGSEGV received ***\\nFatal Python error: Segmentation fault\\n")
        'worker died: SIGSEGV (Segmentation fault)'
        >>> cause_in(EXIT_NOTE.format(code=3))
        'worker exited with code 3'
    """
    found = None
    for match in _MARKS.finditer(text):
        if match["code"] is not None:
            found = f"worker exited with code {match['code']}"
        elif match["signal"]:
            found = f"worker died: {_signal_cause(match['signal'])}"
        elif match["fault"] in FAULTS:
            found = f"worker died: {_signal_cause(FAULTS[match['fault']])}"
    return found


def read_since(log: Path, offset: int) -> tuple[str, int]:
    """The text ``log`` gained since ``offset`` (its last :data:`TAIL_BYTES` at most), and
    its size now; ``("", offset)`` when it cannot be read."""
    try:
        with open(log, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - TAIL_BYTES))
            return f.read().decode(errors="replace"), size
    except OSError:
        return "", offset


def died(error: BaseException | None) -> bool:
    """Whether ``error`` is Ray's word that the trial's process died (not that it raised)."""
    from ray.exceptions import RayActorError

    return isinstance(error, RayActorError)


def ray_detail(error: BaseException) -> str:
    """The first sentence of Ray's ``Worker exit detail`` (``""`` when it has none)."""
    match = re.search(r"Worker exit detail: ([^.]*)", str(error))
    return match[1].strip() if match else ""


SILENT = "worker killed without a word (SIGKILL, or the kernel's OOM killer)"
"""The cause of a worker whose log says nothing of its end: faulthandler reports every fatal
signal a process can catch and :func:`exit_noted` every ``os._exit``, so what is left is a
signal no process sees coming (``kill -9``; the kernel's OOM killer sends the same)."""

NODE_DIED = "because its node has died"
"""What Ray's ``ActorDiedError`` says when the trial's node went, not its process."""


def silent_cause(error: BaseException | None, read: bool) -> str:
    """What ended a worker that wrote no cause to its log (``read``: the driver could read
    that log, so its silence means something).

    Example:
        >>> silent_cause(None, read=True)
        "worker killed without a word (SIGKILL, or the kernel's OOM killer)"
        >>> silent_cause(None, read=False)
        'worker died'
    """
    detail = ray_detail(error) if error is not None else ""
    if "memory" in detail:  # Ray's own memory monitor killed it, and says so
        return f"worker killed by Ray: {detail}"
    if read:
        return SILENT
    return "worker died" + (f" (Ray: {detail})" if detail else "")


def node_lost(error: BaseException | None) -> bool:
    """Whether ``error`` is Ray's word that the trial's node died (the world's doing)."""
    return died(error) and NODE_DIED in str(error)


@contextlib.contextmanager
def exit_noted() -> Iterator[None]:
    """Makes the trial's process say why it goes: faulthandler on (a fatal signal prints its
    name and the stack), and an ``os._exit`` during the block writes :data:`EXIT_NOTE` to
    fd 2 (the trial's log) first. Both are as they were after the block."""
    real_exit = os._exit
    enabled = faulthandler.is_enabled()

    def noted_exit(status: int) -> NoReturn:
        with contextlib.suppress(OSError):
            os.write(2, (EXIT_NOTE.format(code=status) + "\n").encode())
        real_exit(status)

    if not enabled:
        faulthandler.enable(file=2, all_threads=True)
    os._exit = noted_exit
    try:
        yield
    finally:
        os._exit = real_exit
        if not enabled:
            faulthandler.disable()


@dataclass
class _Attempts:
    """What the driver knows of one trial's attempts."""

    read: int = 0
    """How far the trial's log was read at its last death."""
    epoch: int | None = None
    """The last epoch the running attempt reported."""
    death: tuple[str, int] | None = None
    """The cause and epoch of its last death."""
    held: int | None = None
    """The trial's own ``max_failures`` while a retry must prove itself."""


class Deaths:
    """The deaths of a run's trials, told by the Tune callback (:class:`~search.tuning.bridge.
    ErrorCallback`): their reasons, and the retry limit of a trial that died."""

    def __init__(self) -> None:
        self._trials: dict[str, _Attempts] = {}

    def result(self, trial: Trial, result: Mapping[str, Any]) -> None:
        """A result of the running attempt: past the epoch where the worker died, the trial
        gets its remaining retries back."""
        seen = self._trials.setdefault(trial.trial_id, _Attempts())
        if EPOCH in result:
            seen.epoch = int(result[EPOCH])
        if seen.held is not None and seen.death and (seen.epoch or 0) >= seen.death[1]:
            trial.max_failures, seen.held = seen.held, None

    def reason(self, trial: Trial, error: BaseException | None, log: Path | None) -> str | None:
        """Why ``trial`` failed, when its process died (``None``: it raised, Ray says why).

        Call it once per failure: it reads the log from where the last death left it."""
        if not died(error):
            return None
        seen = self._trials.setdefault(trial.trial_id, _Attempts())
        text, seen.read = read_since(log, seen.read) if log else ("", seen.read)
        epoch = _epoch_in_progress(trial, seen.epoch)
        cause = cause_in(text) or silent_cause(error, read=log is not None and log.is_file())
        again = seen.death == (cause, epoch)
        seen.death, seen.epoch = (cause, epoch), None
        retries = trial.run_metadata.num_failures - 1
        note = f" (again on retry {retries}: not retried further)" if again else ""
        return f"{cause} at epoch {epoch}{note}"

    def hold(self, trial: Trial) -> None:
        """Before the retry of a trial whose worker died: its next failure ends it, unless it
        gets past the epoch where the worker died first (:meth:`result`)."""
        seen = self._trials.get(trial.trial_id)
        if seen is None or seen.death is None:
            return
        if seen.held is None:
            seen.held = trial.max_failures
        trial.max_failures = trial.run_metadata.num_failures


def _epoch_in_progress(trial: Trial, reported: int | None) -> int:
    """The epoch a dead attempt was in: the one after its last report, or after the
    checkpoint it resumed from."""
    if reported is None:
        checkpoint = trial.latest_checkpoint_result
        metrics = checkpoint.metrics if checkpoint is not None else {}
        reported = int(metrics.get(EPOCH, 0))
    return reported + 1
