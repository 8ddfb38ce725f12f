"""search: hyperparameter search for deep learning on Ray Tune, Optuna and ASHA.

The user's surface is this package's ``__all__`` and the module :mod:`search.keras`; every
other module is internal and may move. A trainable needs nothing else::

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

Importing it loads NumPy, never Ray, Optuna, PyTorch or TensorFlow.
"""

from search.contract.context import ConfigError, ExportFn, Metrics, TrainFn, TrialContext
from search.contract.dataset import Dataset, load_digits, load_shapes, materialize
from search.contract.declare import trainable
from search.contract.driver import train_to_end
from search.contract.inputs import write_inputs

__all__ = [
    "ConfigError",
    "Dataset",
    "ExportFn",
    "Metrics",
    "TrainFn",
    "TrialContext",
    "__version__",
    "load_digits",
    "load_shapes",
    "materialize",
    "train_to_end",
    "trainable",
    "write_inputs",
]
__version__ = "0.1.0"

_ADAPTERS = ("hf", "keras", "lightning")
"""The framework adapters, imported on first use: ``import search`` then
``search.lightning.fit(...)`` works, and ``import search`` loads none of their frameworks."""


def __getattr__(name: str) -> object:
    """Imports :mod:`search.keras`, :mod:`search.lightning` or :mod:`search.hf` when first
    named (PEP 562)."""
    if name in _ADAPTERS:
        import importlib

        return importlib.import_module(f"search.{name}")
    raise AttributeError(f"module 'search' has no attribute {name!r}")
