"""Stopping a run: every source that stops it, settled in one place (:class:`StopLedger`).

A run stops before its budget for one of these, and the trials still open then are cut by it
(their ``stopped_by``; what each leaves in the study is pinned by ``tests/test_stop_causes.py``):

* the code's verdict, "run stopped early" (exit 2): the first trials failed alike
  (:class:`FailFast`), or a space key is never read (:class:`UnreadKeys`);
* the world, or Ctrl-C, which cut every open trial at once (the bridge's ``cut``): a full disk
  (:class:`search.tuning.faults.DiskFault`, exit 2), SIGTERM (exit 143) or Ctrl-C (exit 130:
  :class:`search.tuning.signals.Termination`), the study taken by another driver (exit 3);
* the device budget (:class:`search.tuning.budget.DeviceBudget`) and the time limit
  (:class:`RunStopper`), which cut the trial that crossed them and then the rest;
* a database that stopped answering (:mod:`search.record.outage`): nothing more is written.

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

import contextlib
import re
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ray.tune.stopper import CombinedStopper, Stopper

from search.errors import closest
from search.record.outage import StorageOutageError
from search.tuning.bridge import TAKEN
from search.tuning.budget import BUDGET_CAUSE, DeviceBudget, budget_for, spent_before
from search.tuning.fate import DISK_FULL, INTERRUPT, TERMINATED
from search.tuning.faults import DiskFault
from search.tuning.scheduler import TIME_ATTR
from search.tuning.signals import Termination

if TYPE_CHECKING:
    from search.compute.placement import Placement
    from search.record.writeback import WriteBehindStorage
    from search.specs.schema import StudySpec
    from search.tuning.bridge import OptunaBridge, Outcome
    from search.tuning.progress import ProgressCallback

FIRST = 3
"""How many first trials must fail the same way before the run stops."""


def _same(reason: str) -> str:
    """The reason without epoch numbers, so ``... at epoch 1`` and ``at epoch 2`` match, and
    without the note of an error that was not retried, so a trial's first attempt (retried)
    and another trial's last (not retried further) match."""
    reason = re.sub(r" \((again on retry \d+: )?not retried[^)]*\)$", "", reason)
    return re.sub(r"\bepoch \d+", "epoch N", reason)


class FailFast:
    """Watches the first trials of a run (a bridge listener); :attr:`verdict` says why to stop.

    Each trial counts once: by its outcome, or until that is in, by the error of an attempt
    that raised and is being retried (:meth:`attempt`, which
    :class:`search.tuning.bridge.ErrorCallback` calls), so the stop comes as soon as the first
    trials raised alike, not after all their retries. One of them must have ended with it (not
    retried, or raised again on its retry): an error every first attempt meets once and no
    retry meets again (a file not yet there, a flaky read) does not stop the run.

    Args:
        first: How many trials to watch (fewer when the budget is smaller).

    Example:
        >>> from search.tuning.bridge import Outcome
        >>> watch = FailFast(first=2)
        >>> for n in range(2):
        ...     watch(Outcome(n, "FAIL", "KeyError: 'lr'", "/t/traceback.txt", code_error=True))
        >>> watch.verdict
        "the first 2 trials failed the same way: KeyError: 'lr' (traceback: /t/traceback.txt)"
        >>> watch = FailFast(first=2)
        >>> for n in range(2):  # both first attempts raised; both are retried
        ...     watch.attempt(Outcome(n, "FAIL", "OSError: x at epoch 1", code_error=True))
        >>> watch.verdict is None
        True
        >>> again = "OSError: x at epoch 2 (again on retry 1: not retried further)"
        >>> watch(Outcome(1, "FAIL", again, code_error=True))  # its retry raised it again
        >>> watch.verdict
        'the first 2 trials failed the same way: OSError: x at epoch 1'
    """

    def __init__(self, first: int = FIRST) -> None:
        self._first = max(1, first)
        self._seen: list[Outcome] = []
        self._final: set[int] = set()  # the watched trials whose outcome is in
        self.verdict: str | None = None

    def __call__(self, outcome: Outcome) -> None:
        self._note(outcome, final=True)

    def attempt(self, outcome: Outcome) -> None:
        """Notes the error of a trial's attempt that Tune retries (``outcome`` a FAIL)."""
        self._note(outcome, final=False)

    def _note(self, outcome: Outcome, final: bool) -> None:
        mine = [i for i, o in enumerate(self._seen) if o.number == outcome.number]
        if mine and final:  # how its retries ended: it counts by that from now on
            self._seen[mine[0]] = outcome
            self._final.add(outcome.number)
        elif not mine and len(self._seen) < self._first:
            self._seen.append(outcome)
            if final:
                self._final.add(outcome.number)
        if len(self._seen) < self._first or not self._final or self.verdict:
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


TIME_LIMIT = "time limit"
"""The ``stopped_by`` of trials the time limit ended."""
STOPPED_EARLY = "run stopped early"
"""The ``stopped_by`` of trials still open when the code's verdict stopped the run."""


@dataclass(frozen=True)
class _Wired:
    """What a ledger is wired to once the bridge exists (:meth:`StopLedger.attach`)."""

    bridge: OptunaBridge
    clock: RunStopper
    meter: DeviceBudget


class StopLedger:
    """Every source that stops a run, asked by Tune's loop and settled in one place.

    In the manner of Syne Tune's ``StoppingCriterion``: one object the loop asks after each
    step whether the run must stop (:meth:`reason`, through :attr:`stopper`), and that says,
    once the loop ended however it ended, what cut the trials still open (:meth:`cause`) and
    settles them (:meth:`settling`). The sources, and their hooks into the bridge, are wired
    here and nowhere else (module docstring).

    Args:
        spec: The run's spec (its time limit, space and trainable).
        budget: The trials this run may start (fail-fast watches the first of them).
        source: The spec file, for the unread-keys line.
        termination: Records SIGTERM and Ctrl-C (a fresh one when ``None``).

    Example:
        >>> from search.specs.schema import parse_spec
        >>> spec = parse_spec({"study": "s", "trainable": "search.testing:curve",
        ...     "objective": {"metric": "acc", "mode": "max"}, "space": {"x": {"uniform": [0, 1]}}})
        >>> ledger = StopLedger(spec, budget=8, source="s.yaml")
        >>> [type(watch).__name__ for watch in ledger.listeners], ledger.verdict()
        (['FailFast', 'UnreadKeys'], None)
    """

    def __init__(
        self,
        spec: StudySpec,
        budget: int,
        source: str,
        termination: Termination | None = None,
    ) -> None:
        self.fail_fast = FailFast(min(FIRST, budget))
        self.unread = UnreadKeys(spec.space, spec.trainable, source)
        self.disk = DiskFault()
        self.termination = termination or Termination()
        self._time_limit_s = spec.budget.time_limit_s
        self._gpu_hours, self._cpu_hours = spec.budget.gpu_hours, spec.budget.cpu_hours
        self._wired: _Wired | None = None

    @property
    def listeners(self) -> list[Callable[[Outcome], None]]:
        """The bridge listeners that watch the first trials for a verdict on the code."""
        return [self.fail_fast, self.unread]

    def attach(self, bridge: OptunaBridge, placement: Placement) -> None:
        """Wires the sources to ``bridge``: what the world or Ctrl-C cut, it settles at once;
        the trial the time limit or the device budget (counted for what each trial holds of
        ``placement``, and what earlier runs of the study spent) stops, it marks cut."""
        self.disk.on_fault = lambda trial_id: bridge.cut(DISK_FULL, trial_id)
        self.termination.on_signal = lambda: bridge.cut(TERMINATED)
        self.termination.on_interrupt = lambda: bridge.cut(INTERRUPT)
        clock = RunStopper(self._time_limit_s, bridge.mark_interrupted, self.reason)
        hours, devices, unit = budget_for(
            self._gpu_hours, self._cpu_hours, placement.gpus_per_trial, placement.cpus_per_trial
        )
        earlier = [
            t.user_attrs for t in bridge.study.get_trials(deepcopy=False) if t.state.is_finished()
        ]
        meter = DeviceBudget(
            hours,
            devices,
            lambda trial_id: bridge.mark_interrupted(trial_id, BUDGET_CAUSE),
            spent_before(earlier, devices),
            unit,
        )
        self._wired = _Wired(bridge, clock, meter)

    @property
    def wired(self) -> _Wired:
        """The bridge, the time limit's stopper and the device budget (after :meth:`attach`)."""
        if self._wired is None:
            raise RuntimeError("StopLedger.attach(bridge, meter) comes first")
        return self._wired

    @property
    def stopper(self) -> Stopper:
        """The Tune stopper: the time limit (asking :meth:`reason` on every step), then the
        device budget."""
        return CombinedStopper(self.wired.clock, self.wired.meter)

    def stopped(self) -> bool:
        """Whether the run's stoppers have stopped it (the stragglers' timer starts then)."""
        return self.wired.clock.stopped or self.wired.meter.exhausted

    def device_hours(self) -> tuple[float, float, str] | None:
        """``(spent, budget, "GPU" or "CPU")`` of the spec's device budget (``None``: none)."""
        meter = self.wired.meter
        return (meter.spent_hours, meter.hours, meter.unit) if meter.hours else None

    def verdict(self) -> str | None:
        """The code's verdict: the run's stopped-early line (``None``: none)."""
        return self.fail_fast.verdict or self.unread.verdict

    def reason(self) -> str | None:
        """Why the run must stop now (``None``: go on); asked on every step of Tune's loop.
        A signal is acted on here, in the loop, not in its handler
        (:mod:`search.tuning.signals`); a lease found taken cuts the run
        (:data:`search.tuning.bridge.TAKEN`)."""
        signalled = self.termination.act()
        taken = None if self.wired.bridge.holds(read=False) else TAKEN
        return self.verdict() or self.disk.verdict or taken or signalled

    def cause(self) -> str:
        """What cut the trials still open when Tune's loop ended: the code's verdict, then
        what cut the whole run (the world, Ctrl-C), then the device budget, then the time
        limit; else the loop ended without a stop (a second Ctrl-C): ``interrupt``."""
        wired = self.wired
        if self.verdict():
            return STOPPED_EARLY
        if wired.bridge.cut_by:
            return wired.bridge.cut_by
        if wired.meter.exhausted:
            return BUDGET_CAUSE
        return TIME_LIMIT if wired.clock.expired else INTERRUPT

    @contextlib.contextmanager
    def settling(
        self, storage: WriteBehindStorage, shown: Sequence[ProgressCallback], places: Sequence[str]
    ) -> Iterator[None]:
        """Runs Tune's loop inside, with SIGTERM and Ctrl-C recorded and Ray's sync warnings
        read for a full disk; however the loop ended, tells every trial still open its fate by
        :meth:`cause` (and its console line in ``shown``) and closes ``storage``; then raises
        the one line of a source that ends the command: a database outage, or a full disk
        (naming the first of ``places``, the results folder and the storage URL, it is on)."""
        bridge, outage = self.wired.bridge, storage.outage
        try:
            with self.termination.watch(), self.disk.watching_ray_logs():
                yield
        except KeyboardInterrupt:  # a second Ctrl-C: at once
            if not self.termination.interrupted:
                raise
        except Exception as exc:  # Tune's own write (its experiment state) met a full disk
            if not self.disk.met(exc) and outage.gave_up is None:
                raise
        finally:
            try:
                self.termination.act()  # a signal the loop had no step left to act on
                if outage.gave_up is None:  # else nothing can be written: the next run
                    bridge.finalize(self.cause())  # settles them
                    for line in shown:  # the lines of the trials finalize settled
                        line.settled()
            finally:
                try:
                    storage.close()
                except Exception:
                    if bridge.holds(read=False) and outage.gave_up is None:
                        raise  # else: writes to trials the new holder settled, refused
        if outage.gave_up is not None:  # the database did not come back in time
            raise StorageOutageError(outage.gave_up)
        self.disk.raise_if_met(places)
