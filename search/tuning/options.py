"""What a run is told (:class:`RunOptions`) and what it reports (:class:`RunSummary`).

Example:
    >>> RunOptions(verbose=1).results_dir
    PosixPath('results')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.tune import Callback


@dataclass(frozen=True)
class RunOptions:
    """How to run (not what to search): where Ray is, where files go, how loud."""

    results_dir: Path = Path("results")
    address: str | None = None
    verbose: int = 0
    progress: bool = True
    notebook: bool = False
    """Show the live block as a notebook's HTML block (``search.run`` in a Jupyter kernel)."""
    restart: bool = False
    takeover: bool = False
    """Take the study's lease even from a driver that looks alive."""
    source: str = "spec"
    """Where the spec came from, for error lines."""
    callbacks: Sequence[Callback] = ()


@dataclass(frozen=True)
class RunSummary:
    """What a finished run reports."""

    study_name: str
    storage: str
    seconds: float
    trials_this_run: int
    interrupted: tuple[int, ...] = ()
    """Trials an earlier, dead driver left open, now FAIL and replaced."""
    states: dict[int, str] = field(default_factory=dict)
    """Optuna trial number -> final state name, for each trial this run finished."""
    stopped_early: str | None = None
    """Why the run stopped before its budget (its first trials all failed alike), if it did."""
    device_hours: tuple[float, float, str] | None = None
    """``(spent, budget, "GPU" or "CPU")`` when the spec has a device-hour budget."""
    terminated: bool = False
    """Whether SIGTERM stopped the run (:mod:`search.tuning.signals`): the CLI exits 143."""
    interrupted_by_user: bool = False
    """Whether Ctrl-C stopped the run (:mod:`search.tuning.signals`): the CLI exits 130."""
    tracking: str | None = None
    """What reached the spec's ``tracking`` (MLflow) and what did not, in one line."""
