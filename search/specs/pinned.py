"""The sampler arguments the project pins, so a study samples the same way under any Optuna.

Optuna 5.0 changed TPE's defaults (multivariate and the constant liar on, TPE instead of
NSGA-II for several objectives). The project never relies on a library default: every
argument its samplers take is written here, passed explicitly, and stored on the study when it
is created (user attribute ``sampler``, see :mod:`search.record.sampling.samplers`); a resume
uses the
stored arguments, so a study continued under another Optuna version (or another version of
this project) proposes as it did. ``sampler.args`` in the spec overrides any of them.

Plain data (no Optuna import), so the spec can check ``sampler.args`` against it.

Example:
    >>> PINNED["tpe"]["n_startup_trials"]
    10
"""

from __future__ import annotations

from typing import Any

_TPE = {
    "multivariate": True,
    "group": True,
    "constant_liar": True,
    "n_startup_trials": 10,
    "n_ei_candidates": 24,
}

PINNED: dict[str, dict[str, Any]] = {
    # TPE's, which the plan for the run's concurrency then sets (record/sampling/auto.py)
    "auto": _TPE,
    "tpe": _TPE,
    "random": {},
    "cmaes": {
        "n_startup_trials": 1,
        "consider_pruned_trials": False,
        "use_separable_cma": False,
        "with_margin": False,
        "lr_adapt": False,
    },
    "grid": {},
}
"""Every argument each sampler is built with, beside its seed. TPE's ``gamma``, ``weights``,
``consider_prior``, ``prior_weight``, ``consider_magic_clip`` and ``consider_endpoints`` are left
to Optuna: all are deprecated since Optuna 4.9 (passing one warns in every run, and 6.0 drops
them), so Optuna holds them fixed itself; the study records the Optuna version that ran it."""
