"""Checks an export bundle's ``model.onnx`` on its own: onnxruntime, no PyTorch, no Ray.

    python scripts/check_onnx.py results/cnn-digits/export

Reads ``config.yaml`` (which data, which split) and ``metrics.json`` (what export measured),
loads the validation split of the data (arrays as ``search.run.data`` gives them: the ONNX model
takes them as they are, NCHW float32), runs ``model.onnx`` with onnxruntime on the CPU and
compares its validation accuracy with the exported one. Exit status 0 when they agree within
one validation example, 1 otherwise; 2 when the bundle cannot be checked.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path, help="the export folder (model.onnx, config.yaml)")
    args = parser.parse_args(argv)
    bundle: Path = args.bundle
    for name in ("model.onnx", "config.yaml", "metrics.json"):
        if not (bundle / name).exists():
            print(f"error: {bundle / name} is missing", file=sys.stderr)
            return 2

    import onnxruntime as ort

    from search.run.data import load_data
    from search.spec.schema import load_spec

    spec = load_spec(bundle / "config.yaml")
    data = load_data(spec.data)
    if len(data.y_val) == 0:
        print(
            f"error: data {spec.data.name!r} is read by the trainable itself; this check "
            "needs array data such as digits",
            file=sys.stderr,
        )
        return 2
    exported = json.loads((bundle / "metrics.json").read_text())["final"]
    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    start = time.perf_counter()
    logits = session.run(None, {"input": data.x_val.astype(np.float32)})[0]
    seconds = time.perf_counter() - start
    accuracy = float((logits.argmax(axis=1) == data.y_val).mean())
    target = float(exported.get("export_val_accuracy", exported["val_accuracy"]))
    diff = abs(accuracy - target)
    allowed = 1.0 / len(data.y_val)
    print(
        f"onnxruntime {ort.__version__}: {len(data.y_val)} validation examples of "
        f"{spec.data.name} in {1000 * seconds:.1f} ms"
    )
    print(
        f"val_accuracy {accuracy:.4f} (onnx) vs {target:.4f} (exported): difference "
        f"{diff:.4f}, allowed {allowed:.4f} (one example)"
    )
    if diff > allowed:
        print("MISMATCH", file=sys.stderr)
        return 1
    print("OK: model.onnx reproduces the exported validation accuracy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
