"""Stopping a run: at its time limit, or early when the user's code fails every trial alike.

A typo in a space key (``KeyError: 'alpah'``) or a metric name fails every trial, and so does
a crash of the trial's process (``worker died: SIGSEGV (Segmentation fault) at epoch 2``).
Rather than spend the whole budget on it, the run stops once the first :data:`FIRST` trials
all failed by their code with the same reason, and says so in one line with the traceback's
path (or the log's, where a dead process left its last words). NaN losses do not count: on an
unstable space they are an answer, not a bug.

A typo that fails nothing is caught too: a plain function that reads ``config.get("alpha",
0.1)`` while the space names ``alpah`` trains every trial on the default, and the study
searches a knob that changes nothing. :class:`UnreadKeys` stops the run once the first trial
that trained has ended, when a space key was never read in the whole trial
(:mod:`search.contract.reads`): every further trial would spend budget on it. A key read only
for some configs (``momentum`` with ``optimizer: sgd``) is stopped too when that first trial
did not read it: the space should say so with ``when:``, or Optuna samples it for nothing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from ray.tune.stopper import Stopper

from search.errors import closest
from search.tuning.scheduler import TIME_ATTR

if TYPE_CHECKING:
    from search.tuning.bridge import Outcome

FIRST = 3
"""How many first trials must fail the same way before the run stops."""


def _same(reason: str) -> str:
    """The reason without epoch numbers, so ``... at epoch 1`` and ``at epoch 2`` match."""
    return re.sub(r"\bepoch \d+", "epoch N", reason)


class FailFast:
    """Watches the first trials of a run (a bridge listener); :attr:`verdict` says why to stop.

    Args:
        first: How many trials to watch (fewer when the budget is smaller).

    Example:
        >>> from search.tuning.bridge import Outcome
        >>> watch = FailFast(first=2)
        >>> for n in range(2):
        ...     watch(Outcome(n, "FAIL", "KeyError: 'lr'", "/t/traceback.txt", code_error=True))
        >>> watch.verdict
        "the first 2 trials failed the same way: KeyError: 'lr' (traceback: /t/traceback.txt)"
    """

    def __init__(self, first: int = FIRST) -> None:
        self._first = max(1, first)
        self._seen: list[Outcome] = []
        self.verdict: str | None = None

    def __call__(self, outcome: Outcome) -> None:
        if len(self._seen) >= self._first:
            return
        self._seen.append(outcome)
        if len(self._seen) < self._first:
            return
        reasons = {_same(o.reason or "") for o in self._seen}
        if all(o.state == "FAIL" and o.code_error for o in self._seen) and len(reasons) == 1:
            self.verdict = (
                f"the first {self._first} trials failed the same way: {self._seen[0].reason}"
                + _where(self._seen)
            )


def unread_message(source: str, trainable: str, unread: Sequence[str], known: Sequence[str]) -> str:
    """The one line for space keys a trainable never read; the closest of ``known`` (the keys
    it asked for in vain, and those it read) to each is suggested.

    Example:
        >>> unread_message("spaces/x.yaml", "mod:fn", ["alpah"], ["alpha"])
        "spaces/x.yaml: space key 'alpah' is never read by trainable mod:fn (did you mean 'alpha'?)"
        >>> unread_message("s.yaml", "m:f", ["a", "zz"], [])
        "s.yaml: space keys 'a', 'zz' are never read by trainable m:f (remove them, or give \
them a when: if only some configs read them)"
    """
    hints = [closest(key, known) for key in unread]
    names = ", ".join(repr(key) for key in unread)
    told = "space key " + names + " is" if len(unread) == 1 else "space keys " + names + " are"
    line = f"{source}: {told} never read by trainable {trainable}"
    meant = [repr(match) for match in hints if match]
    if meant:
        return f"{line} (did you mean {', '.join(meant)}?)"
    them = "it" if len(unread) == 1 else "them"
    return f"{line} (remove {them}, or give {them} a when: if only some configs read {them})"


class UnreadKeys:
    """Watches the first trial that trained to its end, pruned or not (a bridge listener);
    :attr:`verdict` names the space keys it never read (module docstring).

    Args:
        space: The space's keys (``fixed`` keys cost no search, and are not watched).
        trainable: The spec's trainable, for the message.
        source: The spec file, for the message.

    Example:
        >>> from search.tuning.bridge import Outcome
        >>> watch = UnreadKeys(["alpah", "lr"], "mod:fn", "x.yaml")
        >>> watch(Outcome(0, "FAIL", "KeyError: 'x'", unread=("alpah", "lr")))  # not a whole trial
        >>> watch(Outcome(1, "PRUNED", unread=("alpah",), missed=("alpha",)))
        >>> watch.verdict
        "x.yaml: space key 'alpah' is never read by trainable mod:fn (did you mean 'alpha'?)"
    """

    def __init__(self, space: Collection[str], trainable: str, source: str) -> None:
        self._space = set(space)
        self._trainable = trainable
        self._source = source
        self._done = False
        self.verdict: str | None = None

    def __call__(self, outcome: Outcome) -> None:
        if self._done or outcome.unread is None or outcome.state not in ("COMPLETE", "PRUNED"):
            return
        self._done = True
        unread = [key for key in outcome.unread if key in self._space]
        if unread:
            read = sorted(self._space - set(outcome.unread))
            self.verdict = unread_message(
                self._source, self._trainable, unread, [*outcome.missed, *read]
            )


def _where(seen: list[Outcome]) -> str:
    """`` (traceback: PATH)``, or `` (log: PATH)`` for a trial that left no traceback (its
    process died: the log holds what it wrote last), or nothing."""
    for kind, paths in (("traceback", [o.traceback for o in seen]), ("log", [o.log for o in seen])):
        where = next((path for path in paths if path), None)
        if where:
            return f" ({kind}: {where})"
    return ""


class RunStopper(Stopper):
    """Ends the study at ``budget.time_limit_s`` or on a fail-fast verdict, and tells the bridge
    which running trials it cut.

    Ray's own ``time_budget_s`` stops trials with a result that looks like any finished one,
    so the study could not tell a trial cut by the clock from one that ended by itself.

    Args:
        seconds: The wall-clock budget, counted from construction (``None``: no limit).
        on_stop: Receives the Ray trial id of every trial the deadline stops.
        abort: Says why the run must stop now (``None``: go on).
    """

    def __init__(
        self,
        seconds: float | None,
        on_stop: Callable[[str], None],
        abort: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._deadline = time.monotonic() + seconds if seconds is not None else None
        self._on_stop = on_stop
        self._abort = abort
        self._seen: dict[str, Any] = {}  # trial id -> the last iteration it reported
        self.stopped = False
        """Whether :meth:`stop_all` has stopped the run."""

    @property
    def expired(self) -> bool:
        """Whether the time limit has passed."""
        return self._deadline is not None and time.monotonic() >= self._deadline

    def __call__(self, trial_id: str, result: dict) -> bool:
        # When a trial's generator returns, Tune hands its last result in once more; that
        # trial ended by itself (early stopping, the budget), whatever the clock says.
        iteration = result.get(TIME_ATTR)
        repeated = iteration is not None and self._seen.get(trial_id) == iteration
        self._seen[trial_id] = iteration
        if repeated or not self.expired:
            return False
        self._on_stop(trial_id)
        return True

    def stop_all(self) -> bool:
        self.stopped = self.stopped or self.expired or self._abort() is not None
        return self.stopped
