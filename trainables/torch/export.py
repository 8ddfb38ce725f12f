"""The export hook every PyTorch trainable shares: train to the end, save, convert, check.

``train.exporter(make_exporter(train))`` next to a trainable's ``train`` gives it the hook of
:mod:`search.contract`. The hook trains exactly as ``train`` does (same config, seed, data;
the model and its tensors are what the generator returns, ``(model, tensors)`` from
:func:`trainables.torch.loop.fit_epochs`), then writes into ``out_dir``:

    model.safetensors   the trained ``state_dict`` (float32); load it into the trainable's
                        ``build_model`` with ``safetensors.torch.load_model``
    model.onnx          the model for inference, inputs exactly as the framework's Dataset
                        holds them (NCHW float32, e.g. digits 0..16, folder images 0..255:
                        the input scaling the trainable applies is part of the graph),
                        output: logits, any batch size

    inputs.json         the ONNX model's input and output (:func:`search.write_inputs`),
                        with ``"validation": "dataset"``: ``python -m search check`` scores
                        it on the bundle's data split without importing this package

and checks the ONNX file with onnxruntime against PyTorch on random inputs (largest absolute
difference of the logits at most :data:`ONNX_TOLERANCE`, else it raises) and on the
validation split.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from search import ExportFn, Metrics, TrainFn, TrialContext, train_to_end, write_inputs
from trainables.torch.loop import evaluate

if TYPE_CHECKING:
    from search import Dataset

ONNX_TOLERANCE = 1e-4
"""Largest absolute difference allowed between ONNX Runtime's logits and PyTorch's."""

ONNX_OPSET = 18

INPUT_NAME, OUTPUT_NAME = "input", "logits"
"""The ONNX model's input and output names."""


class RawInputs(nn.Module):
    """The trained model behind the trainables' input scaling (``x / scale``)."""

    def __init__(self, model: nn.Module, scale: float) -> None:
        super().__init__()
        self.model, self.scale = model, float(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x / self.scale)


def save_onnx(model: nn.Module, example: torch.Tensor, path: Path) -> None:
    """Exports ``model`` (eval mode, CPU) to ONNX with a dynamic batch dimension."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (example,),
            str(path),
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_shapes=({0: torch.export.Dim("batch", min=1)},),
            opset_version=ONNX_OPSET,
            dynamo=True,
            verbose=False,
            external_data=False,
        )


def onnx_logits(path: Path, x: np.ndarray) -> np.ndarray:
    """ONNX Runtime's logits for the float32 inputs ``x`` (CPU provider)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {INPUT_NAME: np.ascontiguousarray(x, dtype=np.float32)})[0]


def check_onnx(
    model: nn.Module, path: Path, x_raw: torch.Tensor, y: torch.Tensor, seed: int = 0
) -> Metrics:
    """Compares ``path`` with ``model`` on random inputs and scores it on ``(x_raw, y)``.

    Random inputs are uniform over the data's range (0 to its largest value), 32 of them.

    Returns:
        ``onnx_max_abs_diff`` (random and validation inputs) and ``onnx_val_accuracy``.

    Raises:
        ValueError: When the largest difference exceeds :data:`ONNX_TOLERANCE`.
    """
    generator = torch.Generator().manual_seed(seed)
    high = float(x_raw.max()) if len(x_raw) else 1.0
    random = torch.rand((32, *x_raw.shape[1:]), generator=generator) * high
    diff = 0.0
    for x in (random, x_raw):
        with torch.no_grad():
            expected = model(x).numpy()
        got = onnx_logits(path, x.numpy())
        diff = max(diff, float(np.abs(got - expected).max()))
    if not diff <= ONNX_TOLERANCE:
        raise ValueError(
            f"model.onnx: logits differ from PyTorch's by {diff:.3g} (> {ONNX_TOLERANCE})"
        )
    accuracy = float((onnx_logits(path, x_raw.numpy()).argmax(1) == y.numpy()).mean())
    return {"onnx_max_abs_diff": diff, "onnx_val_accuracy": accuracy}


def declare_onnx(out_dir: Path, x_raw: torch.Tensor, num_classes: int) -> Path:
    """Writes ``inputs.json`` for ``model.onnx``: NCHW float32 as the dataset holds it."""
    high = float(x_raw.max()) if len(x_raw) else 1.0
    note = (
        f"values as the dataset holds them (here 0 to {high:g}); the input scaling is inside "
        "the graph"
    )
    return write_inputs(
        out_dir,
        {
            INPUT_NAME: {
                "shape": [None, *x_raw.shape[1:]],
                "dtype": str(x_raw.dtype),
                "layout": "NCHW",
                "note": note,
            }
        },
        {OUTPUT_NAME: {"shape": [None, num_classes], "note": "argmax is the class"}},
        model="model.onnx",
        validation="dataset",
    )


def export_torch(
    train: TrainFn, config: Mapping[str, Any], data: Dataset, ctx: TrialContext, out_dir: Path
) -> Metrics:
    """Trains ``config`` with ``train`` to its end, then saves and checks the model.

    Returns:
        The last epoch's metrics and ``epochs``, plus ``export_val_loss`` and
        ``export_val_accuracy`` (the saved float32 model on the validation split, CPU),
        ``input_scale``, ``onnx_max_abs_diff`` and ``onnx_val_accuracy``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    trained = train_to_end(train, config, data, ctx)
    last, epochs = trained.metrics, trained.epochs
    fitted, tensors = trained.model
    model: nn.Module = fitted.to("cpu").float().eval()

    from safetensors.torch import save_model

    save_model(
        model,
        str(out_dir / "model.safetensors"),
        metadata={
            "config": json.dumps(dict(config), default=str),
            "input_scale": repr(tensors.scale),
        },
    )
    val_loss, val_accuracy = evaluate(
        model, tensors.x_val, tensors.y_val, "fp32", torch.device("cpu")
    )
    served = RawInputs(model, tensors.scale).eval()
    x_raw = tensors.x_val * tensors.scale
    save_onnx(served, x_raw[:2], out_dir / "model.onnx")
    checks = check_onnx(served, out_dir / "model.onnx", x_raw, tensors.y_val, seed=ctx.seed)
    declare_onnx(out_dir, x_raw, tensors.num_classes)
    return {
        **last,
        "epochs": float(epochs),
        "export_val_loss": val_loss,
        "export_val_accuracy": val_accuracy,
        "input_scale": float(tensors.scale),
        **checks,
    }


def make_exporter(train: TrainFn) -> ExportFn:
    """The export hook (:mod:`search.contract`) of the PyTorch trainable ``train``."""

    def export(
        config: Mapping[str, Any], data: Dataset, ctx: TrialContext, out_dir: Path
    ) -> Metrics:
        return export_torch(train, config, data, ctx, out_dir)

    export.__doc__ = f"Export hook of ``{train.__module__}``: see :mod:`trainables.torch.export`."
    return export
