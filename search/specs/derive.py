"""Specs and numbers derived from a spec: one-trial specs, ASHA's milestone epochs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from search.specs.schema import StudySpec


def one_trial_spec(
    spec: StudySpec, fixed: Mapping[str, Any], seed: int, suffix: str, storage: str
) -> dict[str, Any]:
    """A spec that trains ``fixed`` once with ``seed`` (``best.yaml``, an export's
    ``config.yaml``): no space, one trial, no time limit, ASHA and profiling off.

    Args:
        spec: The study's spec.
        fixed: Every parameter of the trial.
        seed: The sampler seed, which is the trial's training seed (trial 0).
        suffix: Appended to the study's name.
        storage: The storage URL to write, already redacted by the caller.
    """
    data = spec.to_dict()
    data["study"] = f"{spec.study}{suffix}"
    data["fixed"] = dict(fixed)
    data["space"] = {}
    limits = ("time_limit_s", "gpu_hours", "cpu_hours")  # a one-trial spec trains to its end
    data["budget"] = {k: v for k, v in data["budget"].items() if k not in limits}
    data["budget"]["trials"] = 1
    data["asha"] = {**data["asha"], "enabled": False}
    data["sampler"] = {"name": "random", "seed": seed}
    data["storage"] = storage
    data.pop("profile", None)
    data.pop("profile_trial", None)
    data.pop("export", None)  # a retrain registers nothing, and a URI may hold a password
    data.pop("tracking", None)  # nor is it tracked
    return data


def ray_milestones(grace_period: float, reduction_factor: float, max_epochs: float) -> list[float]:
    """The rungs of Ray's ASHA bracket, exactly as Ray computes them, smallest first.

    Example:
        >>> ray_milestones(1, 2.5, 9)
        [1.0, 2.5, 6.25]
    """
    import numpy as np  # the same float arithmetic as Ray's own _Bracket

    count = int(np.log(max_epochs / grace_period) / np.log(reduction_factor) + 1)
    return [float(grace_period * reduction_factor**k) for k in range(count)]


def rung_epoch(milestone: float) -> int:
    """The epoch whose result Ray records at ``milestone``: the first one at or past it."""
    return math.ceil(milestone)


def asha_milestones(grace_period: float, reduction_factor: float, max_epochs: int) -> list[int]:
    """ASHA's milestone epochs below ``max_epochs`` (Ray's rungs, as epochs).

    Example:
        >>> asha_milestones(1, 3, 27)
        [1, 3, 9]
        >>> asha_milestones(1, 2.5, 9)
        [1, 3, 7]
    """
    epochs = {rung_epoch(m) for m in ray_milestones(grace_period, reduction_factor, max_epochs)}
    return sorted(e for e in epochs if e < max_epochs)


FIXED_FIELDS = ("trainable", "objective", "space", "fixed", "data", "budget.max_epochs", "asha")
"""What a resumed study must keep: they say what its trials mean and how they are compared."""

ADDED_LATER: dict[str, dict[str, Any]] = {"asha": {"brackets": 1, "recheck": False}}
"""Fields added to :data:`FIXED_FIELDS` blocks after studies were stored without them, with
the value that means what those studies did."""


def _at(data: Mapping[str, Any], path: str) -> Any:
    for key in path.split("."):
        data = data.get(key, {}) if isinstance(data, Mapping) else {}
    return data


def incompatible_change(stored: Mapping[str, Any], spec: StudySpec) -> str | None:
    """The first field of :data:`FIXED_FIELDS` where ``spec`` differs from the ``stored`` spec
    of a study it would resume, as ``field: was X, now Y``; ``None`` when it may resume.

    Example:
        >>> from search.specs.schema import parse_spec
        >>> old = {"study": "s", "trainable": "search.testing:curve",
        ...        "objective": {"metric": "val_accuracy", "mode": "max"}}
        >>> new = parse_spec({**old, "budget": {"trials": 64}})  # more trials: fine
        >>> incompatible_change(parse_spec(old).to_dict(), new) is None
        True
        >>> new = parse_spec({**old, "objective": {"metric": "val_loss", "mode": "min"}})
        >>> print(incompatible_change(parse_spec(old).to_dict(), new))
        objective: was {'metric': 'val_accuracy', 'mode': 'max'}, now {'metric': 'val_loss', ...}
    """
    current = spec.to_dict()
    for path in FIXED_FIELDS:
        before, now = _at(stored, path), _at(current, path)
        if path in ADDED_LATER and isinstance(before, Mapping):  # a study from before them
            before = {**ADDED_LATER[path], **before}
        if before != now:
            return f"{path}: was {before}, now {now}"
    return None
