"""A training process's random generators, seeded from its trial's seed before user code runs.

Trial ``n`` trains with seed ``sampler.seed + n`` (``ctx.seed``). A trainable that seeds
nothing itself (a ``LightningModule`` built before ``trainer.fit``, a plain PyTorch loop) still
trains the same way in its trial, its confirmation run, the exported model and ``train``:
Python's, NumPy's and PyTorch's global generators are seeded here, and TensorFlow's (Keras's)
when it is loaded. PyTorch, TensorFlow and Keras are seeded only when the trainable already
imported them, and only once their import is complete (:func:`loaded`); this module imports
none of them.

TensorFlow is seeded with ``tf.random.set_seed``, never through ``tf.keras``: TensorFlow's
lazy ``tf.keras`` imports Keras on first use, and when that use comes while Keras is itself
being imported (Keras imports TensorFlow, and the settings of :mod:`search.compute.limits`
run the moment TensorFlow's import completes) it fails half way and leaves ``tf.keras``
broken for the rest of the process. Keras is seeded through its own module, once its import
is complete: a trainable that imports Keras inside its function gets the seed the moment
that import ends (:mod:`search.compute.limits`), as a reused process gets it before the
trainable runs.
"""

from __future__ import annotations

import random
import sys
from types import ModuleType

import numpy as np


def seed_everything(seed: int) -> None:
    """Seeds every global generator the process has loaded with ``seed``.

    Example:
        >>> seed_everything(3); a = np.random.random()
        >>> seed_everything(3); a == np.random.random()
        True
    """
    seed = int(seed) % 2**32
    random.seed(seed)
    np.random.seed(seed)
    if (torch := loaded("torch")) is not None:
        torch.manual_seed(seed)
    seed_tensorflow(seed)
    seed_keras(seed)


def seed_tensorflow(seed: int, tf: ModuleType | None = None) -> None:
    """Seeds TensorFlow's global generator (``tf.random.set_seed``) when it is loaded.

    Args:
        tf: TensorFlow's module while its import is just ending (the moment
            :mod:`search.compute.limits` applies its settings), which :func:`loaded` does not
            count yet.
    """
    if (tf := tf or loaded("tensorflow")) is not None:
        tf.random.set_seed(int(seed) % 2**32)


def seed_keras(seed: int, keras: ModuleType | None = None) -> None:
    """Seeds Keras (``keras.utils.set_random_seed``: Python's, NumPy's and TensorFlow's
    generators again, and a fresh global seed generator drawn from them) when it is loaded;
    ``keras``: its module while its import is just ending, as ``tf`` of
    :func:`seed_tensorflow`."""
    if (keras := keras or loaded("keras")) is not None:
        keras.utils.set_random_seed(int(seed) % 2**32)


def loaded(name: str) -> ModuleType | None:
    """The module ``name`` when its import is complete; ``None`` when it was not imported or
    is still running its own import (as TensorFlow's is inside ``import keras``): a module
    half imported has not defined its names yet.

    Example:
        >>> loaded("random") is random, loaded("no_such_module")
        (True, None)
    """
    module = sys.modules.get(name)
    if module is None or getattr(module.__spec__, "_initializing", False):
        return None
    return module
