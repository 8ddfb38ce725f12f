"""Deterministic doubles for tests and benchmarks (like ``optuna.testing``)."""

from search.testing.trainables import curve, instant

__all__ = ["curve", "instant"]
