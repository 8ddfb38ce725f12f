"""The examples take the loader's arrays as trials receive them, read-only views of Ray's
object store, without PyTorch's "not writable" warning (issue 35 item 7).

PyTorch gives that warning once a process: the torch example trains in a process of its own,
and the others are checked by what makes the warning, a tensor on the read-only memory."""

from __future__ import annotations

try:  # torch before TensorFlow: the other order segfaults in this build
    import torch
except ImportError:  # without the torch extra these tests are skipped
    torch = None

import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.torch, pytest.mark.skipif(torch is None, reason="needs PyTorch")]

TRAIN_READ_ONLY = """
import warnings
warnings.filterwarnings("error", message="The given NumPy array is not writable")
from examples.torch_mlp import mlp
from search.contract import TrialContext
data = mlp.load()
for array in data.values():
    array.flags.writeable = False
print(next(mlp.train({}, data, TrialContext(max_epochs=1, num_threads=1)))["val_loss"])
"""


def _read_only(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    for array in data.values():
        array.flags.writeable = False
    return data


def test_the_torch_example_trains_on_read_only_arrays_without_a_warning() -> None:
    done = subprocess.run(
        [sys.executable, "-c", TRAIN_READ_ONLY],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "not writable" not in done.stderr, done.stderr[-2000:]


def test_the_lightning_example_copies_read_only_arrays() -> None:
    pytest.importorskip("lightning")
    from examples.lightning_mlp import mlp

    data = _read_only(mlp.load())
    train, _ = mlp.loaders(data, batch_size=8)
    assert not np.shares_memory(train.dataset.tensors[0].numpy(), data["x_train"])


def test_the_hugging_face_example_copies_read_only_arrays() -> None:
    pytest.importorskip("transformers")
    from examples.hf_text import text

    data = _read_only(text.load(train_size=8, val_size=4))
    first = text.dataset(data["x_train"], data["y_train"])[0]["input_ids"]
    assert not np.shares_memory(first.numpy(), data["x_train"])
