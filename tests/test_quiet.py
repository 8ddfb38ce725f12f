"""TensorFlow's start-up lines (absl's, CUDA's, a ``cuInit`` error on a host without a GPU)
and tf2onnx's deprecation notes stay off the console of a Keras export; the user's own
warnings and lines still show (issue 35 item 7). A whole Keras export's console is checked
with the examples (``tests/test_examples.py``), whose Keras example exports once."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.helpers import REPO, TF_NOISE

pytestmark = [
    pytest.mark.tf,
    pytest.mark.skipif(
        importlib.util.find_spec("tensorflow") is None, reason="tensorflow is not installed"
    ),
]


FILTERED = """
import os, sys, warnings
from search.compute.quiet import native_noise_filtered
with native_noise_filtered():
    import tensorflow as tf
    tf.config.list_physical_devices()
    warnings.warn("the user's own warning")
    os.write(2, b"E0000 00:00:1.5   7 my_op.cc:3] the user's own op failed\\n")
    os.write(2, b"I0000 a progress bar 50%\\r")
    os.write(2, b"I0000 a progress bar 100%\\n")
print("after the block", file=sys.stderr)
"""


def test_the_filter_drops_tensorflows_start_up_lines_and_keeps_the_rest() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FILTERED],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert not [n for n in TF_NOISE if n in done.stderr], done.stderr
    for kept in (
        "UserWarning: the user's own warning",
        "my_op.cc:3] the user's own op failed\n",
        "I0000 a progress bar 50%",  # its \r reads as a newline in text mode
        "I0000 a progress bar 100%\n",
        "after the block\n",
    ):
        assert kept in done.stderr, done.stderr
