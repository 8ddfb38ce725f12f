"""Checks an export bundle's ``model.onnx`` on its own: onnxruntime, no PyTorch, no Ray.

    python scripts/check_onnx.py results/cnn-digits/export

A thin wrapper around :func:`search.handover.check.check_bundle` (also
``python -m search check BUNDLE``): it reads the inputs the export hook declared
(``inputs.json``, else the ONNX graph's own), runs ``model.onnx`` with onnxruntime on random
inputs of those shapes and, where the bundle names validation data (the built-in PyTorch
bundles: their ``config.yaml`` data split), compares its validation accuracy with
``metrics.json``. The trainable's package is never imported, so it works from any folder.
Exit status 0 when every check passes, 1 when one fails, 2 when the bundle cannot be checked.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import search  # noqa: F401
except ImportError:  # run from a checkout that is not installed: the repository's own package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search.handover.check import main

if __name__ == "__main__":
    sys.exit(main())
