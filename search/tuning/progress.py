"""Console progress as a Tune ``Callback``: rung-aware, quiet, one line per finished trial.

Ray ignores custom progress reporters since 2.6, so progress is a callback (Ray's own wide
trial table stays available behind ``run --verbose 1``..``3``). It shows:

- one line per finished trial, printed after the bridge has told the study the trial's fate
  (so the state shown is the stored one): ``[elapsed done/total] trial N STATE epoch E
  metric=value best=...``; this is all that reaches a pipe or a CI log;
- on a terminal (stderr is a TTY), a live status block under those lines, refreshed a few
  times a second: trials running / finished / complete / pruned / failed, the best value so
  far and its trial, ASHA's rungs (how many trials reached each milestone epoch), the elapsed
  time and an estimate of what is left;
- at the end, one line with the final rung counts.

The estimate of what is left is the wall time per finished trial so far times the trials
still to finish (capped by ``budget.time_limit_s``). Ray pickles callbacks with the experiment
state, so the console and the live display are left out of the pickle and rebuilt.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ray.tune import Callback
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from search.tuning import terminal
from search.tuning.fate import EPOCH
from search.tuning.notebook import NotebookLive

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

    from search.tuning.bridge import OptunaBridge

STYLE = {"COMPLETE": "green", "PRUNED": "yellow", "FAIL": "red"}


def duration(seconds: float) -> str:
    """``42s``, ``3m07s`` or ``1h02m``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def retried(attrs: Mapping[str, Any]) -> str:
    """`` (retried 1 time after RecursionError: ...)`` for a trial Ray had to retry (its
    user attributes ``retries`` and ``retried_after``), else nothing."""
    count = int(attrs.get("retries") or 0)
    if not count:
        return ""
    after = attrs.get("retried_after") or []
    last = f" after {after[-1]}" if after else ""
    times = "time" if count == 1 else "times"
    return f" [yellow](retried {count} {times}{escape(last)})[/yellow]"


class ProgressCallback(Callback):
    """Prints a line per finished trial and, on a terminal, a live rung-aware status block.

    Args:
        bridge: The bridge whose ``finished`` map holds each trial's stored state.
        metric: The objective metric.
        mode: ``"min"`` or ``"max"``.
        total: The trial budget, for the ``done/total`` counter.
        console: Where to print (a rich console; stderr by default).
        milestones: ASHA's milestone epochs (:func:`asha_milestones`); empty without ASHA.
        max_epochs: The epoch budget of a trial (the last "rung": trained to the end).
        time_limit_s: The study's time limit, which caps the estimate of what is left.
        live: Show the live block; by default only when the console is a terminal.
        notebook: Show the live block as a notebook's HTML block
            (:class:`~search.tuning.notebook.NotebookLive`), in a Jupyter kernel.
    """

    def __init__(
        self,
        bridge: OptunaBridge,
        metric: str,
        mode: str,
        total: int,
        console: Console | None = None,
        *,
        milestones: Sequence[int] = (),
        max_epochs: int | None = None,
        time_limit_s: float | None = None,
        live: bool | None = None,
        notebook: bool = False,
    ) -> None:
        self._bridge, self._metric, self._mode, self._total = bridge, metric, mode, total
        self._console = console or terminal.console(stderr=True)
        self._milestones = tuple(int(m) for m in milestones)
        self._max_epochs, self._time_limit = max_epochs, time_limit_s
        self._want_live = self._console.is_terminal if live is None else live
        self._notebook = notebook
        self._live: Live | NotebookLive | None = None
        self._start = time.monotonic()
        self._best: float | None = None
        self._best_number: int | None = None
        self._done = 0
        self._states: dict[str, int] = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0}
        self._epochs: dict[str, int] = {}  # Ray trial id -> last epoch reported
        self._running: set[str] = set()
        self._seen: dict[str, Trial] = {}  # Ray trial id -> the trial, for :meth:`settled`
        self._shown: set[str] = set()  # Ray trial ids whose line is printed
        self._dropped: set[str] = set()  # metric names already said to be left out

    def __getstate__(self) -> dict[str, Any]:  # Ray pickles callbacks; consoles have locks
        return {**self.__dict__, "_console": None, "_live": None, "_seen": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._console = terminal.console(stderr=True)

    # --- what is shown -------------------------------------------------------------------

    def rung_counts(self) -> list[tuple[int, int]]:
        """``(milestone, trials that reached it)`` for each milestone and for ``max_epochs``."""
        marks = list(self._milestones)
        if self._max_epochs and self._max_epochs not in marks:
            marks.append(self._max_epochs)
        return [(m, sum(e >= m for e in self._epochs.values())) for m in marks]

    def rung_text(self) -> str:
        """``rungs ≥1:6 ≥3:3 ≥9:1 end(27):1`` (empty without milestones or a budget)."""
        parts = [
            f"{f'end({m})' if m == self._max_epochs else f'≥{m}'}:{n}"
            for m, n in self.rung_counts()
        ]
        return ("rungs " + " ".join(parts)) if parts else ""

    def estimate_left(self) -> float | None:
        """Seconds still to go: wall time per finished trial times the trials left."""
        elapsed = time.monotonic() - self._start
        left = None
        if self._done:
            left = elapsed / self._done * max(0, self._total - self._done)
        if self._time_limit:
            cap = max(0.0, self._time_limit - elapsed)
            left = cap if left is None else min(left, cap)
        return left

    def status(self) -> Text:
        """The live block: counts; best and rungs; elapsed and what is left (three lines)."""
        s = self._states
        best = f"{self._best:.4f} (trial {self._best_number})" if self._best is not None else "-"
        left = self.estimate_left()
        counts = Text.assemble(
            (f"{len(self._running)}", "bold"),
            " running  ",
            (f"{self._done}/{self._total}", "bold"),
            " finished: ",
            (f"{s['COMPLETE']} complete", "green"),
            ", ",
            (f"{s['PRUNED']} pruned", "yellow"),
            ", ",
            (f"{s['FAIL']} failed", "red"),
        )
        rungs = Text.assemble(
            f"best {self._metric} {best}   ", (self.rung_text() or "no ASHA rungs", "cyan")
        )
        eta = "estimating what is left" if left is None else f"~{duration(left)} left"
        clock = Text(f"elapsed {duration(time.monotonic() - self._start)}   {eta}", style="dim")
        return Text("\n").join([counts, rungs, clock])

    def __rich__(self) -> Group:
        return Group(self.status())

    # --- Tune's hooks -----------------------------------------------------------------------

    def setup(
        self,
        stop: Any = None,
        num_samples: int | None = None,
        total_num_samples: int | None = None,
        **info: Any,
    ) -> None:
        self._start = time.monotonic()
        if self._notebook and self._live is None:
            self._live = NotebookLive(lambda: self.status().plain)
            self._live.start()
        elif self._want_live and self._live is None:
            self._live = Live(
                self,
                console=self._console,
                refresh_per_second=4,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if isinstance(self._live, NotebookLive):  # rich's Live refreshes itself
            self._live.refresh()

    def on_trial_start(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self._running.add(trial.trial_id)
        self._seen[trial.trial_id] = trial

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        epoch = result.get(EPOCH)
        if isinstance(epoch, int | float):
            self._epochs[trial.trial_id] = max(int(epoch), self._epochs.get(trial.trial_id, 0))
        self._running.add(trial.trial_id)
        self._seen[trial.trial_id] = trial

    def on_trial_complete(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self._line(trial)

    def on_trial_error(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self._line(trial)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self.close()
        self._seen.update((t.trial_id, t) for t in trials)

    def settled(self) -> None:
        """The line of each trial the run settled after Tune's loop ended (those running when
        the run stopped early, at a signal, at the budget: Tune tells no callback of them),
        then the rung counts. Called once the bridge has told the study every trial's fate."""
        self.close()
        for trial_id in self._bridge.finished:
            trial = self._seen.get(trial_id)
            if trial_id not in self._shown and trial is not None:
                self._line(trial)
        rungs = self.rung_text()
        if rungs and self._done:
            self._console.print(f"[dim]{rungs} (trials that reached each milestone epoch)[/dim]")

    def close(self) -> None:
        """Stops the live block (idempotent)."""
        if self._live is not None:
            live, self._live = self._live, None
            live.stop()

    # --- helpers ---------------------------------------------------------------------------

    def _improves(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self._best is None:
            return True
        return value > self._best if self._mode == "max" else value < self._best

    def _line(self, trial: Trial) -> None:
        self._running.discard(trial.trial_id)
        self._shown.add(trial.trial_id)
        number, state = self._bridge.finished.get(trial.trial_id, (-1, "?"))
        result = trial.last_result or {}
        value = result.get(self._metric)
        if state == "COMPLETE" and isinstance(value, int | float) and self._improves(value):
            self._best, self._best_number = float(value), number
        self._done += 1
        if state in self._states:
            self._states[state] += 1
        epoch = result.get(EPOCH, 0)
        if isinstance(epoch, int | float):
            self._epochs[trial.trial_id] = max(int(epoch), self._epochs.get(trial.trial_id, 0))
        shown = f"{value:.4f}" if isinstance(value, int | float) else "-"
        best = f"{self._best:.4f}" if self._best is not None else "-"
        style = STYLE.get(state, "white")
        outcome = self._bridge.outcomes.get(trial.trial_id)
        why = ""
        if outcome is not None and outcome.reason:
            why = f" [red]{escape(outcome.reason)}[/red]"
            files = [
                f"{name}: {escape(path)}"
                for name, path in (("traceback", outcome.traceback), ("output", outcome.log))
                if path
            ]
            if files:
                why += f" [dim]({'; '.join(files)})[/dim]"
        why += retried(outcome.attrs if outcome is not None else {})
        self._console.print(
            f"[dim][{time.monotonic() - self._start:7.1f}s {self._done:>3}/{self._total}][/dim] "
            f"trial {number:>3} [{style}]{state:<8}[/{style}] epoch {epoch:>3} "
            f"{self._metric}={shown} best={best}{why}"
        )
        self._say_dropped(number, outcome.dropped if outcome is not None else ())

    def _say_dropped(self, number: int, dropped: Sequence[str]) -> None:
        """One line the first time metrics that are not numbers are left out (and again only
        for names not yet said)."""
        new = sorted(set(dropped) - self._dropped)
        if not new:
            return
        self._dropped.update(new)
        self._console.print(
            f"[yellow]trial {number} yielded metrics that are not numbers; left out: "
            f"{escape(', '.join(new))}[/yellow] [dim](user attribute dropped_metrics)[/dim]"
        )
