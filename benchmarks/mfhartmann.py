"""The multi-fidelity Hartmann 6 function as a trainable: each epoch is one step up in fidelity.

A learning-curve benchmark with a published definition, for testing early stopping (tabular
final values cannot). Name it in a spec as ``benchmarks.mfhartmann:train`` (run from the
repository root, or with it on ``PYTHONPATH``) and search ``x0`` ... ``x5`` in [0, 1],
minimizing ``value``.

The definition (Kandasamy et al. 2017, "Multi-fidelity Bayesian optimisation with continuous
approximations", ICML, appendix; as implemented by mf-prior-bench's ``MFHartmann6`` generator
and benchmark, ``mfpbench/synthetic/hartmann/``, the one the PriorBand paper, Mallik et al.
2023, runs as ``mfh6_good`` and ``mfh6_bad``). What is matched, term by term:

* Hartmann 6 with its standard ``A``, ``P`` and ``alpha`` (below); minimum ``F_STAR`` =
  -3.32237 at ``X_STAR`` (Surjanovic and Bingham's Virtual Library of Simulation Experiments).
* Fidelity. Here ``z = epoch / max_epochs``. mf-prior-bench's fidelity runs over 1 ... 100
  (its benchmark queries 3 ... 100) and enters bias and noise log-scaled,
  ``s = log(fidelity) / log(100)``; the same with ``fidelity = 100 z``:
  ``s = log(100 z) / log(100)`` (clipped at 0), so epoch 1 of 27 (``100 z`` = 3.7) is about
  mf-prior-bench's lowest fidelity, and the curve's shape does not depend on ``max_epochs``.
  ``z`` itself is the fidelity of the cost model.
* Bias: ``alpha' = alpha - bias * (1 - s)``, the same shift for all four terms; at ``s = 1``
  the function is Hartmann 6 itself.
* Noise: ``|N(0, 1)| * noise * (1 - s)`` added to the value (always upwards, i.e. worse, as in
  mf-prior-bench); none at the last epoch. mf-prior-bench seeds it from (seed, z, x); here from
  (the trial's seed, epoch), so a trial's curve is reproducible and a retry sees the same one.
* Presets ``(bias, noise)`` are mf-prior-bench's: ``mfh6`` (0.5, 0.1), ``good`` (2.5, 2.0),
  ``moderate`` (3.0, 3.0), ``bad`` (3.5, 4.0), ``terrible`` (4.0, 5.0).
* Cost (mf-prior-bench's, from Kandasamy et al. p. 18): evaluating at fidelity ``z`` in (0, 1]
  costs ``lambda(z) = 0.05 + 0.95 z**2`` (of a full evaluation). A trial continues where its
  previous epoch ended (freeze-thaw), so epoch ``e`` costs the increment
  ``lambda(e / E) - lambda((e - 1) / E)``, the first ``lambda(1 / E)``, and a trial stopped
  after ``e`` epochs has cost exactly ``lambda(e / E)``, what mf-prior-bench charges a query at
  that fidelity. The trainable sleeps that cost times ``seconds_per_trial``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from search.contract import Metrics, TrialContext, trainable

ALPHA = np.array([1.0, 1.2, 3.0, 3.2])
A = np.array(
    [
        [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
        [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
        [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
        [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
    ]
)
P = 1e-4 * np.array(
    [
        [1312, 1696, 5569, 124, 8283, 5886],
        [2329, 4135, 8307, 3736, 1004, 9991],
        [2348, 1451, 3522, 2883, 3047, 6650],
        [4047, 8828, 8732, 5743, 1091, 381],
    ]
)
X_STAR = (0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573)
F_STAR = -3.32237
"""Hartmann 6's global minimum, at :data:`X_STAR`."""

PRESETS: dict[str, tuple[float, float]] = {
    "mfh6": (0.5, 0.1),
    "good": (2.5, 2.0),
    "moderate": (3.0, 3.0),
    "bad": (3.5, 4.0),
    "terrible": (4.0, 5.0),
}
"""mf-prior-bench's ``(bias, noise)`` presets of MFHartmann6."""

FIDELITY_RANGE = 100.0
"""mf-prior-bench's highest fidelity (its lowest is 1): ``s`` is 0 at ``z`` = 1 / 100."""

MIN_COST = 0.05
"""``lambda(0)``: the share of a full evaluation that even the lowest fidelity costs."""

PARAMS = tuple(f"x{i}" for i in range(6))
DEFAULTS: dict[str, Any] = {
    **dict.fromkeys(PARAMS, 0.5),
    "preset": "mfh6",
    "seconds_per_trial": 0.0,
}


def log_fidelity(z: float) -> float:
    """mf-prior-bench's log-scaled fidelity ``s`` of ``z`` in (0, 1]: 1 at ``z = 1``, 0 at
    ``z <= 1 / 100``.

    Example:
        >>> log_fidelity(1.0), log_fidelity(0.1), log_fidelity(0.001)
        (1.0, 0.5, 0.0)
    """
    return max(0.0, math.log(FIDELITY_RANGE * z) / math.log(FIDELITY_RANGE))


def hartmann6(x: Sequence[float], s: float = 1.0, bias: float = 0.0) -> float:
    """The noise-free value at log-fidelity ``s``: Hartmann 6 with ``alpha - bias * (1 - s)``.

    Example:
        >>> round(hartmann6(X_STAR), 5)
        -3.32237
    """
    alpha = ALPHA - bias * (1.0 - s)
    inner = np.sum(A * (np.asarray(x, dtype=float) - P) ** 2, axis=1)
    return float(-np.sum(alpha * np.exp(-inner)))


def noise_scale(s: float, noise: float) -> float:
    """The scale of the half-normal noise at log-fidelity ``s`` (0 at ``s = 1``)."""
    return noise * (1.0 - s)


def cost(z: float) -> float:
    """``lambda(z)``: what an evaluation at fidelity ``z`` in (0, 1] costs (1 at ``z = 1``)."""
    return MIN_COST + (1.0 - MIN_COST) * z**2


def trial_cost(epochs: int, max_epochs: int) -> float:
    """What a trial that trained ``epochs`` epochs cost, in full evaluations (0 for none)."""
    return cost(epochs / max_epochs) if epochs > 0 else 0.0


def regret(x: Sequence[float]) -> float:
    """The true regret of ``x``: its noise-free full-fidelity value minus :data:`F_STAR`."""
    return hartmann6(x) - F_STAR


def value_at(x: Sequence[float], epoch: int, max_epochs: int, preset: str, seed: int) -> float:
    """The noisy, biased value a trial reports after ``epoch`` epochs."""
    bias, noise = PRESETS[preset]
    s = log_fidelity(epoch / max_epochs)
    draw = abs(float(np.random.default_rng([seed, epoch]).normal()))
    return hartmann6(x, s, bias) + noise_scale(s, noise) * draw


@trainable(defaults=DEFAULTS)
def train(config: Mapping[str, Any], data: Any, ctx: TrialContext) -> Iterator[Metrics]:
    """Yields the value at each epoch's fidelity, after sleeping that epoch's cost.

    Config keys:
        x0 ... x5: The point, each in [0, 1].
        preset: One of :data:`PRESETS` (bias and noise).
        seconds_per_trial: Simulated seconds of a full-fidelity evaluation (0: no sleep).
    """
    x = [float(config.get(name, 0.5)) for name in PARAMS]
    preset = str(config.get("preset", "mfh6"))
    if preset not in PRESETS:
        raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {preset!r}")
    scale = float(config.get("seconds_per_trial", 0.0))
    total = ctx.max_epochs
    for epoch in range(ctx.start_epoch, total + 1):
        time.sleep(scale * (trial_cost(epoch, total) - trial_cost(epoch - 1, total)))
        yield {
            "value": value_at(x, epoch, total, preset, ctx.seed),
            "fidelity": epoch / total,
        }
