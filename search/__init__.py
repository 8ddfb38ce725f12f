"""search: hyperparameter search for deep learning on Ray Tune, Optuna and ASHA.

The user's surface is this package's ``__all__`` and the adapters :mod:`search.keras`,
:mod:`search.lightning`, :mod:`search.hf` and :mod:`search.pytorch`; every other module is
internal and may move. A trainable needs nothing else::

    from search import TrialContext, train_to_end, trainable, write_inputs

Why each name is public:

- :func:`trainable`: the decorator that declares a trainable's knobs and export hook.
- :class:`TrialContext`: what a trainable is told about its trial (typed fields).
- :class:`Dataset`: what a trainable receives from the spec's built-in datasets.
- ``Metrics``, ``TrainFn``, ``ExportFn``: the types of a yielded epoch, a trainable and an
  export hook, for users who type their code (``search.keras.train_and_save`` takes a
  ``TrainFn``).
- :func:`train_to_end`: an export hook trains to the end with it.
- :class:`ConfigError`: raised on an unusable knob, it fails the trial without retries.
- :func:`write_inputs`: an export hook declares its model's inputs with it.
- :func:`materialize`: reads an ``image_folder`` dataset inside the trial (the driver only
  passes its layout).
- :func:`load_digits`: the ``digits`` dataset as a trial receives it, for a trainable's unit
  test or a pretext task.
- :func:`load_shapes`: the ``shapes`` dataset (CIFAR-sized images generated in code) as a
  trial receives it, for the same.
- :func:`run`: a search from Python (a notebook, a script): the spec as a path, YAML text or
  a dict, the trainable as a function; returns a :class:`SearchResult`.
- :func:`load`: the :class:`SearchResult` of a study that exists, read live.
- :class:`SearchResult`: a study's best config and value, trials and curves as DataFrames,
  and ``export``, ``report``, ``register`` as the commands do them.
- :class:`SpecError`, :class:`SearchError`: what ``run`` and ``load`` raise on a bad spec
  (one line naming the field) and on anything else the commands refuse in one line.

Importing it loads NumPy, never Ray, Optuna, PyTorch or TensorFlow: ``run``, ``load`` and
``SearchResult`` import their modules when first named.
"""

from search.contract.context import ConfigError, ExportFn, Metrics, TrainFn, TrialContext
from search.contract.dataset import Dataset, load_digits, load_shapes, materialize
from search.contract.declare import trainable
from search.contract.driver import train_to_end
from search.contract.inputs import write_inputs
from search.errors import SearchError, SpecError

__all__ = [
    "ConfigError",
    "Dataset",
    "ExportFn",
    "Metrics",
    "SearchError",
    "SearchResult",  # noqa: F822 (imported when first named: __getattr__)
    "SpecError",
    "TrainFn",
    "TrialContext",
    "__version__",
    "load",  # noqa: F822 (imported when first named: __getattr__)
    "load_digits",
    "load_shapes",
    "materialize",
    "run",  # noqa: F822 (imported when first named: __getattr__)
    "train_to_end",
    "trainable",
    "write_inputs",
]
__version__ = "0.1.0"

_ADAPTERS = ("hf", "keras", "lightning", "pytorch")
"""The framework adapters, imported on first use: ``import search`` then
``search.lightning.fit(...)`` works, and ``import search`` loads none of their frameworks."""


_LAZY = {"run": "search.api", "load": "search.result", "SearchResult": "search.result"}
"""The Python door's names, by module: each imports Optuna (and ``run`` Ray Tune) when named."""


def __getattr__(name: str) -> object:
    """Imports :mod:`search.keras`, :mod:`search.lightning`, :mod:`search.hf` or
    :mod:`search.pytorch`, or the
    module of ``run``, ``load`` or ``SearchResult``, when first named (PEP 562)."""
    import importlib

    if name in _ADAPTERS:
        return importlib.import_module(f"search.{name}")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'search' has no attribute {name!r}")
