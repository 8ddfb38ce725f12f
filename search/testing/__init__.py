"""Deterministic doubles for tests and benchmarks (like ``optuna.testing``)."""

from search.testing.trainables import (
    HOSTILE_MODES,
    SIDE_METRICS_DROPPED,
    chatty,
    curve,
    curve_export,
    hostile,
    instant,
    returns_dict,
    side_metrics,
)

__all__ = [
    "HOSTILE_MODES",
    "SIDE_METRICS_DROPPED",
    "chatty",
    "curve",
    "curve_export",
    "hostile",
    "instant",
    "returns_dict",
    "side_metrics",
]
