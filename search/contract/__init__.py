"""The contract between the framework and a trainable: the bottom layer, imported by all.

What a trainable receives (:class:`TrialContext`, :class:`Dataset`), how it is found and what
its module declares (:mod:`.registry`), and the one loop that drives it (:mod:`.driver`).
Internal: users import the public names from the package root (``from search import
trainable, TrialContext``; :mod:`search`), which re-exports them from here. The names
imported below are a shortcut for the layers above, not a public list: the one public face
is the root's ``__all__``.
"""

from search.contract.context import (  # noqa: F401
    RESERVED_PREFIX,
    ConfigError,
    ExportFn,
    Metrics,
    TrainFn,
    TrialContext,
)
from search.contract.dataset import Dataset  # noqa: F401
from search.contract.declare import Declaration, trainable  # noqa: F401
from search.contract.driver import (  # noqa: F401
    Epoch,
    Trained,
    as_metrics,
    drive,
    metric_problem,
    nonfinite_reason,
    train_to_end,
)
from search.contract.inputs import write_inputs  # noqa: F401
from search.contract.registry import (  # noqa: F401
    BUILTIN,
    BUILTIN_KNOBS,
    HANDED,
    Declarations,
    UnknownTrainableError,
    check_trainable,
    declarations,
    declared_defaults,
    hand_over,
    receive,
)
