"""Retry a packed trial that ran out of GPU memory with twice its GPU share.

The part of the GPU memory handling that needs Ray Tune (a Tune callback), kept out of
:mod:`search.compute`, which imports no ``ray.tune``: Tune retries a failed trial, and
:class:`OomRetry` doubles the GPU share of one that ran out of memory first
(:func:`search.compute.placement.grow_share`); its worker then holds the larger share, and
:meth:`search.compute.placement.Share.holding` gives it a cap in proportion.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune import Callback

from search.compute.placement import grow_share

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

_log = logging.getLogger(__name__)

OOM_RETRIES = 2
"""Tune retries a packed trial at least this often (each retry doubles its GPU share)."""

_OOM_MARKERS = (
    "OutOfMemoryError",
    "CUDA out of memory",
    "RESOURCE_EXHAUSTED",
    "OOM when allocating",
    "out of memory",
)


def out_of_memory(text: str) -> bool:
    """Whether an error's text says the GPU ran out of memory (PyTorch or TensorFlow)."""
    return any(marker in text for marker in _OOM_MARKERS)


def _last_error(trial: Trial) -> str:
    path = getattr(trial, "error_file", None)
    if not path or not Path(path).is_file():
        return ""
    text = Path(path).read_text(errors="replace")
    return text.rsplit("Failure # ", 1)[-1]


class OomRetry(Callback):
    """Before Tune retries a trial that ran out of GPU memory, doubles its GPU share.

    Tune calls ``on_trial_recover`` once the failed trial is PENDING again; its resources may
    then change, and the retry starts (from its last checkpoint) in a new actor with the larger
    share, which the worker turns into a larger memory cap
    (:meth:`search.compute.placement.Share.holding`).
    """

    def on_trial_recover(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        if not out_of_memory(_last_error(trial)):
            return
        factory = trial.placement_group_factory
        required: dict[str, float] = dict(factory.required_resources) if factory else {}
        share = float(required.get("GPU", 0.0))
        if not 0 < share < 1:
            return
        bigger = grow_share(share)
        trial.update_resources({"cpu": float(required.get("CPU", 1.0)), "gpu": bigger})
        _log.warning(
            "trial %s ran out of GPU memory at %.4g of a GPU; retrying with %.4g",
            trial.trial_id,
            share,
            bigger,
        )
