"""A training process's random generators, seeded from its trial's seed before user code runs.

Trial ``n`` trains with seed ``sampler.seed + n`` (``ctx.seed``). A trainable that seeds
nothing itself (a ``LightningModule`` built before ``trainer.fit``, a plain PyTorch loop) still
trains the same way in its trial, its confirmation run, the exported model and ``train``:
Python's, NumPy's and PyTorch's global generators are seeded here, and TensorFlow's (Keras's)
when it is loaded. PyTorch and TensorFlow are seeded only when the trainable already imported
them; this module imports neither.
"""

from __future__ import annotations

import random
import sys

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
    if "torch" in sys.modules:
        import torch

        torch.manual_seed(seed)
    if "tensorflow" in sys.modules:
        seed_tensorflow(seed)


def seed_tensorflow(seed: int) -> None:
    """Seeds TensorFlow's and Keras's generators (``keras.utils.set_random_seed``)."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(int(seed) % 2**32)
