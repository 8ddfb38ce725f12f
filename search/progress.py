"""Console progress as a Tune ``Callback``: one quiet line per finished trial.

Ray ignores custom progress reporters since 2.6, so progress is a callback. It prints through
rich, after the bridge has told the study the trial's fate, so the state shown is the stored one.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from ray.tune import Callback
from rich.console import Console

from search.record import EPOCH

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

    from search.bridge import OptunaBridge

STYLE = {"COMPLETE": "green", "PRUNED": "yellow", "FAIL": "red"}


class ProgressCallback(Callback):
    """Prints ``[elapsed] trial N STATE epoch E metric=value best=...`` as trials finish.

    Args:
        bridge: The bridge whose ``finished`` map holds each trial's stored state.
        metric: The objective metric.
        mode: ``"min"`` or ``"max"``.
        total: The trial budget, for the ``done/total`` counter.
        console: Where to print (a rich console; stderr by default).
    """

    def __init__(
        self,
        bridge: OptunaBridge,
        metric: str,
        mode: str,
        total: int,
        console: Console | None = None,
    ) -> None:
        self._bridge, self._metric, self._mode, self._total = bridge, metric, mode, total
        self._console = console or Console(stderr=True, highlight=False)
        self._start = time.monotonic()
        self._best: float | None = None
        self._done = 0

    def __getstate__(self) -> dict[str, Any]:  # Ray pickles callbacks; a Console has locks
        return {**self.__dict__, "_console": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._console = Console(stderr=True, highlight=False)

    def _improves(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self._best is None:
            return True
        return value > self._best if self._mode == "max" else value < self._best

    def _line(self, trial: Trial) -> None:
        number, state = self._bridge.finished.get(trial.trial_id, (-1, "?"))
        result = trial.last_result or {}
        value = result.get(self._metric)
        if state == "COMPLETE" and isinstance(value, int | float) and self._improves(value):
            self._best = float(value)
        self._done += 1
        shown = f"{value:.4f}" if isinstance(value, int | float) else "-"
        best = f"{self._best:.4f}" if self._best is not None else "-"
        style = STYLE.get(state, "white")
        self._console.print(
            f"[dim][{time.monotonic() - self._start:7.1f}s {self._done:>3}/{self._total}][/dim] "
            f"trial {number:>3} [{style}]{state:<8}[/{style}] epoch {result.get(EPOCH, 0):>3} "
            f"{self._metric}={shown} best={best}"
        )

    def on_trial_complete(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self._line(trial)

    def on_trial_error(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self._line(trial)
