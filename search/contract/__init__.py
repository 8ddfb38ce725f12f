"""The contract between the framework and a trainable: the bottom layer, imported by all.

What a trainable receives (:class:`TrialContext`, :class:`Dataset`), how it is found and what
its module declares (:mod:`.registry`), and the one loop that drives it (:mod:`.driver`).
Internal: users import the public names from the package root (``from search import
trainable, TrialContext``; :mod:`search`), which re-exports them from here.
"""

from search.contract.context import (
    RESERVED_PREFIX,
    ConfigError,
    ExportFn,
    Metrics,
    TrainFn,
    TrialContext,
)
from search.contract.dataset import Dataset
from search.contract.declare import Declaration, trainable
from search.contract.driver import (
    Epoch,
    Trained,
    as_metrics,
    drive,
    metric_problem,
    nonfinite_reason,
    train_to_end,
)
from search.contract.inputs import write_inputs
from search.contract.registry import (
    BUILTIN,
    BUILTIN_KNOBS,
    Declarations,
    UnknownTrainableError,
    check_trainable,
    declarations,
    declared_defaults,
)

__all__ = [
    "BUILTIN",
    "BUILTIN_KNOBS",
    "ConfigError",
    "RESERVED_PREFIX",
    "Dataset",
    "Declaration",
    "Declarations",
    "Epoch",
    "ExportFn",
    "Metrics",
    "TrainFn",
    "Trained",
    "TrialContext",
    "UnknownTrainableError",
    "as_metrics",
    "check_trainable",
    "declarations",
    "declared_defaults",
    "drive",
    "metric_problem",
    "nonfinite_reason",
    "train_to_end",
    "trainable",
    "write_inputs",
]
