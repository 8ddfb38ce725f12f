"""Deterministic doubles for tests and benchmarks (like ``optuna.testing``)."""

from search.testing.trainables import HOSTILE_MODES, curve, curve_export, hostile, instant

__all__ = ["HOSTILE_MODES", "curve", "curve_export", "hostile", "instant"]
