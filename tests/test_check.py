"""``check_bundle`` and ``scripts/check_onnx.py``: a user's model.onnx checked from anywhere."""

from __future__ import annotations

try:  # torch before TensorFlow: the other order segfaults in this build
    import torch
except ImportError:  # without the torch extra these tests are skipped
    torch = None

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from search.contract.inputs import InputsError, read_inputs, tensor, write_inputs
from search.handover.check import BundleCheckFailed, BundleError, check_bundle
from tests.helpers import REPO
from tests.helpers import onnx_export as _export
from tests.helpers import tabular_bundle as _bundle
from tests.helpers import tabular_mlp as _mlp
from tests.helpers import tabular_val as _val

pytestmark = [pytest.mark.torch, pytest.mark.skipif(torch is None, reason="needs PyTorch")]


def _script(bundle: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "check_onnx.py"), str(bundle)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_a_user_tabular_bundle_is_checked_without_its_package(
    tmp_path: Path, onnx_file: tuple[Path, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = _bundle(tmp_path, onnx_file)
    declared = read_inputs(bundle)
    assert declared is not None and declared.validation == "validation.npz"
    assert json.loads((bundle / "inputs.json").read_text())["inputs"] == [
        {"name": "x", "shape": [None, 30], "dtype": "float32"}
    ]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    lines = check_bundle(bundle)
    assert lines[0].endswith("inputs declared in inputs.json")
    assert "  input  x: float32 [None, 30]" in lines
    assert any(line.startswith("random inputs (x (2, 30)): outputs (2, 2)") for line in lines)
    assert lines[-1] == "OK: model.onnx reproduces the exported validation accuracy"
    proc = _script(bundle, elsewhere)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: model.onnx reproduces" in proc.stdout and proc.stderr == ""


def test_without_inputs_json_the_graph_names_the_inputs(
    tmp_path: Path, onnx_file: tuple[Path, float]
) -> None:
    bundle = _bundle(tmp_path, onnx_file, declare=False)
    lines = check_bundle(bundle)
    assert "read from the ONNX graph (no inputs.json)" in lines[0]
    assert "  input  x: float32 [None, 30]" in lines
    assert any(
        line.startswith("validation accuracy: not checked (no inputs.json") for line in lines
    )
    hint = [line for line in lines if "the export hook can add it" in line]
    assert hint and "search.write_inputs(" in hint[0] and "contract" not in hint[0]  # public
    assert lines[-1] == "OK: model.onnx runs on inputs of the declared shapes"
    proc = _script(bundle, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_folder_without_model_onnx_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bundle = tmp_path / "tf-bundle"
    (bundle / "saved_model").mkdir(parents=True)
    (bundle / "model.keras").write_bytes(b"keras")
    with pytest.raises(BundleError, match=r"no model.onnx in .*it holds model.keras, saved_model/"):
        check_bundle(bundle)
    with pytest.raises(BundleError, match=r"with search\.keras\.save_onnx\(model, out_dir\)"):
        check_bundle(bundle)  # the one-line fix of a Keras bundle first
    proc = _script(bundle, tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: no model.onnx in ") and proc.stderr.count("\n") == 1
    missing = _script(tmp_path / "nothing", tmp_path)
    assert missing.returncode == 2 and missing.stderr.startswith("error: no bundle folder at")


def test_the_check_names_the_studys_own_accuracy(
    tmp_path: Path, onnx_file: tuple[Path, float]
) -> None:
    """A Hugging Face study's metric is ``eval_accuracy``: the check compares with it, by
    that name, not with a ``val_accuracy`` the study never had."""
    bundle = _bundle(tmp_path, onnx_file)
    final = {"eval_accuracy": onnx_file[1], "eval_loss": 0.3}
    (bundle / "metrics.json").write_text(json.dumps({"final": final}))
    (bundle / "config.yaml").write_text(
        "study: text-final\ntrainable: nowhere_pkg.text:train\n"
        "objective: {metric: eval_accuracy, mode: max}\n"
    )
    lines = check_bundle(bundle)
    compared = [line for line in lines if "(onnx, " in line]
    assert compared and compared[0].startswith("eval_accuracy "), lines
    assert "(exported eval_accuracy)" in compared[0]
    assert lines[-1] == "OK: model.onnx reproduces the exported validation accuracy"


def test_an_accuracy_that_differs_fails_with_exit_1(
    tmp_path: Path, onnx_file: tuple[Path, float]
) -> None:
    bundle = _bundle(tmp_path, onnx_file, target=onnx_file[1] - 0.2)
    with pytest.raises(BundleCheckFailed, match="metrics.json says") as failed:
        check_bundle(bundle)
    assert failed.value.lines[-1].startswith("val_accuracy ")
    proc = _script(bundle, tmp_path)
    assert proc.returncode == 1 and proc.stderr.startswith("MISMATCH: model.onnx scores")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"inputs": [{"name": "input", "shape": [None, 30]}]}, "declares input.s. input, but"),
        ({"inputs": [{"name": "x", "shape": [None, 31]}]}, r"declared \[None, 31\]"),
        ({"inputs": [{"name": "x", "shape": [None, 30], "dtype": "int64"}]}, "declared int64"),
        ({"inputs": []}, "no inputs declared"),
        ({"inputs": [{"name": "x"}]}, "missing field 'shape'"),
        ({"inputs": [{"name": "x", "shape": [None, 30]}], "validation": "v.npz"}, "v.npz"),
        (
            {"inputs": [{"name": "x", "shape": [None, 30]}], "validation": "dataset"},
            r"input 'x' has shape \(360, 1, 8, 8\), declared \[None, 30\]",
        ),
    ],
)
def test_a_wrong_description_is_one_line(
    tmp_path: Path, onnx_file: tuple[Path, float], content: dict[str, Any], message: str
) -> None:
    bundle = _bundle(tmp_path, onnx_file, declare=False)
    (bundle / "inputs.json").write_text(json.dumps(content))
    with pytest.raises(BundleError, match=message) as raised:
        check_bundle(bundle)
    assert "\n" not in str(raised.value)


def test_an_unreadable_model_is_one_line(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "model.onnx").write_bytes(b"not a protobuf at all")
    proc = _script(bundle, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and "onnxruntime cannot load it" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_write_inputs_reads_an_onnx_graph_and_refuses_nonsense(
    tmp_path: Path, onnx_file: tuple[Path, float]
) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "model.onnx").write_bytes(onnx_file[0].read_bytes())
    write_inputs(bundle, bundle / "model.onnx")
    data = json.loads((bundle / "inputs.json").read_text())
    assert data["inputs"] == [{"name": "x", "shape": [None, 30], "dtype": "float32"}]
    assert data["outputs"][0]["name"] == "logits" and data["outputs"][0]["shape"][0] is None
    assert tensor("t", torch.zeros(4, 3, dtype=torch.int64)).as_dict() == {
        "name": "t",
        "shape": [None, 3],
        "dtype": "int64",
    }
    with pytest.raises(InputsError, match="a dimension must be"):
        write_inputs(bundle, {"x": [None, -1]})
    with pytest.raises(InputsError, match="scale must be finite"):
        tensor("x", [None, 3], scale=float("nan"))


def test_a_builtin_torch_bundle_is_scored_on_its_data_split(tmp_path: Path) -> None:
    """The built-in hook's ONNX model and ``inputs.json`` (``validation: dataset``), without
    training: the check feeds the digits as the dataset holds them."""
    from search.contract.dataset import load_digits
    from trainables.torch import cnn
    from trainables.torch.data import to_tensors
    from trainables.torch.export import RawInputs, declare_onnx, save_onnx

    torch.manual_seed(0)
    tensors = to_tensors(load_digits(0.2, 0))
    served = RawInputs(cnn.build_model({**cnn.DEFAULTS, "channels": 4}, tensors), 16.0).eval()
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    x_raw = tensors.x_val * tensors.scale
    save_onnx(served, x_raw[:2], bundle / "model.onnx")
    declare_onnx(bundle, x_raw, tensors.num_classes)
    assert json.loads((bundle / "inputs.json").read_text())["inputs"][0]["shape"] == [
        None,
        1,
        8,
        8,
    ]
    with torch.no_grad():
        accuracy = float((served(x_raw).argmax(1) == tensors.y_val).float().mean())
    (bundle / "metrics.json").write_text(json.dumps({"final": {"export_val_accuracy": accuracy}}))
    (bundle / "config.yaml").write_text(
        "study: cnn-final\ntrainable: torch_cnn\nobjective: {metric: val_accuracy, mode: max}\n"
        "data: {name: digits, val_fraction: 0.2, split_seed: 0}\n"
    )
    lines = check_bundle(bundle)
    assert "  input  input: float32 [None, 1, 8, 8], NCHW" in lines[1]
    assert lines[-1] == "OK: model.onnx reproduces the exported validation accuracy"
    (bundle / "inputs.json").unlink()  # a bundle written before inputs.json: the same check
    assert check_bundle(bundle)[-1] == lines[-1]


def test_a_single_logit_output_is_not_scored_by_argmax(tmp_path: Path) -> None:
    """A binary model with one logit column (the examples' MLP): accuracy not checked, no
    false mismatch."""
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(30, 1)).eval()
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    _export(model, bundle / "model.onnx")
    x, y = _val()
    write_inputs(bundle, {"x": x[:2]}, validation=(x, y.astype(np.float32)))
    (bundle / "metrics.json").write_text(json.dumps({"final": {"val_accuracy": 0.93}}))
    lines = check_bundle(bundle)
    assert any("not checked (the first output has shape (143, 1)" in line for line in lines)
    assert lines[-1] == "OK: model.onnx runs on inputs of the declared shapes"


def test_a_shipped_subset_is_compared_with_the_framework_on_the_same_rows(
    tmp_path: Path, onnx_file: tuple[Path, float]
) -> None:
    """validation.npz holds only rows the model gets right (accuracy 1.0), metrics.json the
    whole split's: the check compares with the framework's accuracy on the shipped rows."""
    bundle = _bundle(tmp_path, onnx_file)
    x, y = _val()
    with torch.no_grad():
        right = _mlp()(torch.from_numpy(x)).argmax(1).numpy() == y
    assert onnx_file[1] < 0.95  # the whole split scores differently from the subset
    write_inputs(bundle, {"x": x[:2]}, validation=(x[right], y[right]), validation_accuracy=1.0)
    assert json.loads((bundle / "inputs.json").read_text())["validation_accuracy"] == 1.0
    lines = check_bundle(bundle)
    assert "(the framework on the same rows, inputs.json)" in lines[-2]
    assert lines[-1] == "OK: model.onnx reproduces the exported validation accuracy"

    write_inputs(bundle, {"x": x[:2]}, validation=(x[right], y[right]))  # no reference
    with pytest.raises(BundleCheckFailed, match="metrics.json says") as failed:
        check_bundle(bundle)
    assert str(failed.value).endswith(
        " (on the whole validation split); if validation.npz holds only some of its rows, give "
        "the framework's accuracy on exactly those rows: search.write_inputs(..., "
        "validation=(x, labels), validation_accuracy=...)"
    )


SERVE = """
import json, sys
from pathlib import Path
import numpy as np, onnxruntime as ort
bundle = Path(sys.argv[1])
spec = json.loads((bundle / "inputs.json").read_text())
(inp,) = spec["inputs"]
x = np.asarray(json.loads(sys.stdin.read()), dtype=np.float64)
x = x / inp.get("scale", 1.0)
x = (x - np.asarray(inp.get("mean", 0.0))) / np.asarray(inp.get("std", 1.0))
session = ort.InferenceSession(str(bundle / spec["model"]), providers=["CPUExecutionProvider"])
scores = session.run(None, {inp["name"]: x.astype(inp["dtype"])})[0]
assert not {"search", "torch", "tensorflow"} & set(sys.modules), "imported more than ort"
print(json.dumps([spec["classes"][i] for i in scores.argmax(1)]))
"""


def test_a_server_with_only_onnxruntime_and_numpy_turns_raw_rows_into_labels(
    tmp_path: Path, onnx_file: tuple[Path, float]
) -> None:
    """inputs.json carries the normalization and class names: a script that knows nothing
    else labels raw rows as the framework (PyTorch after the same normalization) does."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    raw, mean, std = data.data[::4], data.data.mean(0), data.data.std(0)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "model.onnx").write_bytes(onnx_file[0].read_bytes())
    write_inputs(bundle, bundle / "model.onnx", mean=mean, std=std, classes=data.target_names)
    declared = read_inputs(bundle)
    assert declared is not None and declared.classes == ("malignant", "benign")
    assert np.allclose(declared.inputs[0].mean, mean) and np.allclose(declared.inputs[0].std, std)
    with torch.no_grad():
        x = torch.from_numpy(((raw - mean) / std).astype(np.float32))
        expected = [str(data.target_names[i]) for i in _mlp()(x).argmax(1).numpy()]
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-I", str(script), str(bundle)],
        input=json.dumps(raw.tolist()),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == expected
    with pytest.raises(InputsError, match="std must be finite and non-zero"):
        write_inputs(bundle, bundle / "model.onnx", std=np.zeros(30))
