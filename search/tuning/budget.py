"""A device-time budget: ``budget.gpu_hours`` or ``budget.cpu_hours`` ends the study.

Ray Tune has only wall time (``time_budget_s``) and Optuna a timeout per process, but budgets
are asked for in GPU-hours. What a study spends is the sum, over its trials, of each trial's
training seconds times the devices it holds (its GPUs, or its CPUs), counted from every result
Tune hands in; the trials of earlier runs of the study count too. When the spend reaches the
budget the trial that crossed it stops, and with it every running trial (at its next result,
so the overshoot is at most one epoch of each): each ends PRUNED with ``stopped_by: budget``,
as a trial cut by the time limit does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ray.tune import Stopper

from search.errors import SearchError

BUDGET_CAUSE = "budget"
"""The ``stopped_by`` of trials the device budget ended."""


class BudgetError(SearchError):
    """A device budget on a device the trials do not hold (``gpu_hours`` without GPUs)."""


class DeviceBudget(Stopper):
    """Counts device-hours from Tune's results and ends the study at ``hours``.

    Args:
        hours: The budget, in device-hours (``None``: no budget, never stops).
        devices: What one trial holds of the budgeted device (GPUs, or CPUs).
        on_stop: Receives the Ray trial id of the trial whose result crossed the budget.
        spent_before: Device-hours the study spent in earlier runs.
        unit: What is counted, ``"GPU"`` or ``"CPU"`` (for people).

    Example:
        >>> budget = DeviceBudget(0.002, devices=2.0, on_stop=print)  # 7.2 device-seconds
        >>> budget("a", {"time_this_iter_s": 3.0}), round(budget.spent_hours * 3600, 1)
        (False, 6.0)
        >>> budget("b", {"time_this_iter_s": 1.0})
        b
        True
        >>> budget.stop_all(), budget.exhausted
        (True, True)
    """

    def __init__(
        self,
        hours: float | None,
        devices: float,
        on_stop: Callable[[str], None],
        spent_before: float = 0.0,
        unit: str = "",
    ) -> None:
        self.hours, self.unit = hours, unit
        self._devices = devices
        self._on_stop = on_stop
        self.spent_hours = spent_before

    @property
    def exhausted(self) -> bool:
        """Whether the spend has reached the budget."""
        return self.hours is not None and self.spent_hours >= self.hours

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        seconds = result.get("time_this_iter_s")
        if isinstance(seconds, int | float) and not result.get("done"):
            self.spent_hours += float(seconds) * self._devices / 3600.0
        if not self.exhausted:
            return False
        self._on_stop(trial_id)
        return True

    def stop_all(self) -> bool:
        return self.exhausted


def budget_for(
    gpu_hours: float | None, cpu_hours: float | None, gpus: float, cpus: float
) -> tuple[float | None, float, str]:
    """``(hours, devices per trial, unit)`` of the spec's budget (``(None, 0, "")``: none).

    Raises:
        BudgetError: For ``gpu_hours`` when the trials hold no GPU.

    Example:
        >>> budget_for(2.0, None, gpus=0.5, cpus=1.0)
        (2.0, 0.5, 'GPU')
        >>> budget_for(None, 1.0, gpus=0.0, cpus=2.0)
        (1.0, 2.0, 'CPU')
    """
    if gpu_hours is not None:
        if gpus <= 0:
            raise BudgetError(
                "budget.gpu_hours: the trials hold no GPU here; use budget.cpu_hours, "
                "or give trials GPUs (resources.gpus_per_trial)"
            )
        return gpu_hours, gpus, "GPU"
    if cpu_hours is not None:
        return cpu_hours, cpus, "CPU"
    return None, 0.0, ""


def spent_before(user_attrs: Iterable[dict[str, Any]], devices: float) -> float:
    """Device-hours of earlier trials, from each one's recorded ``seconds``."""
    seconds = sum(float(a.get("seconds") or 0.0) for a in user_attrs)
    return seconds * devices / 3600.0
