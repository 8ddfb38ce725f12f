"""``export --mlflow URI --promote``: ``champion`` moves only to a version that beats it.

Each registered version carries, as tags, its confirmed mean, std and number of runs on the
primary objective, its mode and the fingerprint of its validation data
(:func:`search.handover.registry.data_fingerprint`). The new version takes ``champion``
when there is none, or when both were scored on the same validation data and the new mean
is better by more than one standard error of the difference of the two means
(``sqrt(std_new**2 / n_new + std_old**2 / n_old)``). Otherwise one line says why and
``champion`` stays where it is.
"""

from __future__ import annotations

import math
from typing import Any

CHAMPION = "champion"
TAG = "search."


def version_tags(
    metrics: dict[str, Any], lineage: dict[str, str], confirmed: dict[str, dict[str, Any]]
) -> dict[str, str]:
    """The tags of a new version: the study, the trial, the confirmed primary objective
    (``confirmed``: per objective, its confirmed stats)."""
    metric, mode = metrics["objective"]["metric"], metrics["objective"]["mode"]
    stats = confirmed[metric]
    runs = stats.get("ok", stats.get("runs", 0) - stats.get("failed", 0))
    return {
        TAG + "study": metrics["study"],
        TAG + "source_trial": str(metrics["chosen"]["source_trial"]),
        TAG + "metric": metric,
        TAG + "mode": mode,
        TAG + "confirmed_mean": repr(float(stats["mean"])),
        TAG + "confirmed_std": repr(float(stats.get("std") or 0.0)),
        TAG + "confirmed_runs": str(max(int(runs or 1), 1)),
        TAG + "data_fingerprint": lineage.get(TAG + "data_fingerprint", ""),
    }


def _stats(tags: dict[str, str]) -> tuple[float, float, int]:
    return (
        float(tags[TAG + "confirmed_mean"]),
        float(tags.get(TAG + "confirmed_std", "0")),
        int(tags.get(TAG + "confirmed_runs", "1")),
    )


def verdict(new: dict[str, str], old: dict[str, str]) -> str:
    """Why ``new`` does not replace ``old`` as champion; '' when it does."""
    if TAG + "confirmed_mean" not in old:
        return "the champion has no confirmed mean recorded by search"
    if new.get(TAG + "metric") != old.get(TAG + "metric"):
        return f"the champion was ranked on {old.get(TAG + 'metric')}, not {new[TAG + 'metric']}"
    if new.get(TAG + "data_fingerprint") != old.get(TAG + "data_fingerprint"):
        return "the champion was scored on other validation data (data fingerprints differ)"
    (m1, s1, n1), (m0, s0, n0) = _stats(new), _stats(old)
    se = math.sqrt(s1**2 / n1 + s0**2 / n0)
    gain = (m1 - m0) if new.get(TAG + "mode") == "max" else (m0 - m1)
    if gain > se:
        return ""
    metric = new[TAG + "metric"]
    return (
        f"its confirmed {metric} {m1:.4f} does not beat the champion's {m0:.4f} by more than "
        f"one standard error ({se:.4f})"
    )


def promote(client: Any, name: str, version: str, log: Any) -> bool:
    """Moves ``champion`` of ``name`` to ``version`` when it beats the current one (module
    docstring); logs one line either way and returns whether it moved."""
    from mlflow.exceptions import MlflowException

    new = client.get_model_version(name, version)
    try:
        old = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        old = None
    if old is not None:
        why = verdict(dict(new.tags), dict(old.tags))
        if why:
            log(f"champion stays at version {old.version} of {name}: version {version}: {why}")
            return False
    client.set_registered_model_alias(name, CHAMPION, version)
    before = f" (was version {old.version})" if old is not None else " (the first)"
    log(f"champion is now version {version} of {name}{before}")
    return True
