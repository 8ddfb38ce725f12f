"""Deterministic doubles for tests and benchmarks (like ``optuna.testing``)."""

from search.testing.trainables import curve, curve_export, instant

__all__ = ["curve", "curve_export", "instant"]
