"""Trainables with known, deterministic behaviour: no framework, no data, milliseconds a trial.

Name them in a spec as ``search.testing:curve`` or ``search.testing:instant``; PyTorch only
where a trainable says so (``side_metrics``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from search.contract import Metrics, TrialContext, trainable
from search.contract.dataset import Dataset


@trainable()
def curve(config: Mapping[str, Any], data: Dataset, ctx: TrialContext) -> Iterator[Metrics]:
    """A learning curve that rises towards ``x`` (in [0, 1], higher is better).

    It checkpoints like a real trainable: each epoch it writes ``state.json`` into
    ``ctx.checkpoint_dir`` and, when retried, continues from ``ctx.start_epoch``.

    Config keys:
        x: Quality in [0, 1]; the curve approaches it.
        lr: Above 1.0 the loss turns NaN at epoch 2 (an exploding run).
        raise_at: Epoch at which the trainable raises ``ValueError``, every attempt.
        fail_once_at: Epoch at which the first attempt raises ``RuntimeError``.
        fail_once_in: A folder: the first attempt of each trial number and seed raises
            ``RuntimeError`` at epoch 1, and leaves a file there that later attempts, in any
            process, find (a run without a Tune checkpoint, as a confirmation run).
        raise_above: Every attempt raises ``ValueError`` at epoch 1 when ``x`` is above it.
        die_at: Epoch at which the process dies, every attempt: by ``die_by``, ``"exit"``
            (``os._exit(3)``, the default) or ``"segfault"`` (a read of address 0: SIGSEGV).
        stop_at: Epoch after which it stops on its own (early stopping).
        sleep: Seconds to wait after each epoch.
        hang_at: Epoch in which the trial hangs (sleeps for good): no result, no error.
        hang_trial: Only this trial number hangs (default: every trial).
        save_every: Write the state only every this many epochs (1, 1 + n, ...).
        latency: Yield it as ``latency_ms`` each epoch (a cost objective).
        hold_file, hold_from: Trials numbered ``hold_from`` or more wait (up to 120 s) until
            the file ``hold_file`` exists before their first epoch (a test's gate).
        onnx: The export hook also writes ``model.onnx`` (:func:`scaling_onnx`).
        trace_dir, wait_for, oom_below_share: see :func:`_traced` (placement tests).
    """
    if any(key in config for key in _TRACE_KEYS):
        yield from _traced(config, data, ctx)
        return
    quality = float(config.get("x", 0.5))
    if config.get("hold_file") and ctx.trial_number >= int(config.get("hold_from", 0)):
        deadline = time.monotonic() + 120.0
        while not Path(str(config["hold_file"])).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    if ctx.restore_dir is not None:  # the saved state must be there and agree with the epoch
        saved = json.loads((Path(ctx.restore_dir) / "state.json").read_text())
        assert saved["epoch"] == ctx.start_epoch - 1
    _fail_first(config, ctx, quality)
    for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
        if config.get("raise_at") == epoch:
            raise ValueError(f"synthetic failure at epoch {epoch}")
        if config.get("fail_once_at") == epoch and ctx.restore_dir is None:
            raise RuntimeError(f"transient failure at epoch {epoch}")
        if config.get("hang_at") == epoch and config.get("hang_trial", ctx.trial_number) == (
            ctx.trial_number
        ):
            time.sleep(10**6)  # a deadlock, a stuck data loader: silence, no error
        _die(config, epoch)
        accuracy = quality * (1.0 - 0.5**epoch)
        loss = 1.0 - accuracy
        if float(config.get("lr", 0.0)) > 1.0 and epoch >= 2:
            loss = float("nan")
        every = int(config.get("save_every", 1))
        if ctx.checkpoint_dir is not None and (epoch - 1) % every == 0:
            (Path(ctx.checkpoint_dir) / "state.json").write_text(json.dumps({"epoch": epoch}))
        costs = {"latency_ms": float(config["latency"])} if "latency" in config else {}
        yield {"val_accuracy": accuracy, "val_loss": loss, **costs}
        if config.get("stop_at") == epoch:
            return
        time.sleep(float(config.get("sleep", 0.0)))


def _fail_first(config: Mapping[str, Any], ctx: TrialContext, quality: float) -> None:
    """``fail_once_in`` and ``raise_above`` of :func:`curve`, before its first epoch."""
    if "raise_above" in config and quality > float(config["raise_above"]):
        raise ValueError(f"x={quality} is above raise_above")
    if config.get("fail_once_in"):
        mark = Path(str(config["fail_once_in"])) / f"{ctx.trial_number}-{ctx.seed}"
        if not mark.exists():
            mark.parent.mkdir(parents=True, exist_ok=True)
            mark.touch()
            raise RuntimeError(f"transient failure of trial {ctx.trial_number} seed {ctx.seed}")


def _die(config: Mapping[str, Any], epoch: int) -> None:
    """Ends the trial's process the hard way at epoch ``die_at``."""
    if config.get("die_at") != epoch:
        return
    if config.get("die_by") == "segfault":
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    os._exit(3)


_TRACE_KEYS = ("trace_dir", "wait_for", "oom_below_share")


class OutOfMemoryError(RuntimeError):
    """A synthetic "CUDA out of memory" (named like PyTorch's, which the runner retries)."""


def _write_whole(path: Path, record: Mapping[str, Any]) -> None:
    """Write ``record`` as JSON to ``path`` so that a reader sees all of it or the old file."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(record))
    part.replace(path)


def _traced(config: Mapping[str, Any], data: Dataset, ctx: TrialContext) -> Iterator[Metrics]:
    """:func:`curve`, recording where and when each trial ran (placement tests).

    Config keys:
        trace_dir: Folder where each attempt writes ``trial-<n>-<pid>.json``: trial number,
            start and end (``time.time()``), pid, ``CUDA_VISIBLE_DEVICES``, ``ctx.device``,
            ``ctx.num_threads``, ``ctx.gpu_share`` and ``ctx.gpu_memory_fraction``.
        wait_for: Before its first epoch, wait (up to 60 s) until this many trials have
            started in ``trace_dir``: a barrier that only passes when they run at once.
        oom_below_share: Raise :class:`OutOfMemoryError` while the trial holds less than this
            share of a GPU (``ctx.gpu_share``).
    """
    import os

    folder = Path(str(config.get("trace_dir", ".")))
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "trial": ctx.trial_number,
        "pid": os.getpid(),
        "start": time.time(),
        "end": None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device": ctx.device,
        "num_threads": ctx.num_threads,
        "gpu_share": ctx.gpu_share,
        "gpu_memory_fraction": ctx.gpu_memory_fraction,
        "ctx_gpu_memory_fraction": ctx.gpu_memory_fraction,
        # the cap the framework applied before this code ran (read by PyTorch's allocator)
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }
    path = folder / f"trial-{ctx.trial_number}-{os.getpid()}.json"
    _write_whole(path, record)
    try:
        needed, deadline = int(config.get("wait_for", 0)), time.monotonic() + 60.0
        while needed and time.monotonic() < deadline:
            started = {p.name.split("-")[1] for p in folder.glob("trial-*.json")}
            if len(started) >= needed:
                break
            time.sleep(0.05)
        share = float(ctx.gpu_share or 0.0)
        if share < float(config.get("oom_below_share", 0.0)):
            raise OutOfMemoryError(f"CUDA out of memory (synthetic) at {share} of a GPU")
        inner = {k: v for k, v in config.items() if k not in _TRACE_KEYS}
        yield from curve(inner, data, ctx)
    finally:
        # Tune may end the actor while this runs: the file holds the old record or the new
        _write_whole(path, {**record, "end": time.time()})


def instant(config: Mapping[str, Any], data: Dataset, ctx: TrialContext) -> Iterator[Metrics]:
    """One epoch, no work: measures pure orchestration overhead."""
    yield {"val_accuracy": float(config.get("x", 0.0))}


def chatty(config: Mapping[str, Any], data: Dataset, ctx: TrialContext) -> Iterator[Metrics]:
    """One epoch that writes a line naming its trial to stdout (``print``), to stderr at the
    file-descriptor level (``os.write(2, ...)``, as C code does) and from a child process;
    trial number ``fail_trial`` then raises ``KeyError`` (a code error: not retried)."""
    print(f"stdout of trial {ctx.trial_number}", flush=True)
    os.write(2, f"stderr of trial {ctx.trial_number}\n".encode())
    child = f"import os; os.write(1, b'child of trial {ctx.trial_number}\\n')"
    subprocess.run([sys.executable, "-c", child], check=True)
    if config.get("fail_trial") == ctx.trial_number:
        raise KeyError(f"fail_trial {ctx.trial_number}")
    yield {"val_accuracy": float(config.get("x", 0.0))}


@curve.exporter
def curve_export(
    config: Mapping[str, Any], data: Dataset, ctx: TrialContext, out_dir: Path
) -> Metrics:
    """The export hook of :func:`curve` (``search.handover.export``): trains it, writes
    ``model.json``; with ``onnx: true`` in the config also :func:`scaling_onnx` as
    ``model.onnx`` (a registry has a real model to log and serve)."""
    last: Metrics = {}
    for metrics in curve(config, data, ctx):
        last = dict(metrics)
        if ctx.history is not None:
            ctx.history.append(dict(metrics))
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "model.json").write_text(json.dumps({"x": config.get("x"), **last}))
    if config.get("onnx"):
        scaling_onnx(Path(out_dir) / "model.onnx", float(config.get("x", 0.5)))
    return {**last, "export_val_accuracy": last.get("val_accuracy", 0.0)}


def scaling_onnx(path: Path, factor: float) -> Path:
    """An ONNX graph without any framework: input ``x`` (float32, ``[batch, 2]``), output
    ``scores = x * [factor, 1 - factor]``."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.array([factor, 1.0 - factor], np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["scores"])],
        "curve",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 2])],
        initializer=[weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # onnxruntime reads it
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


HOSTILE_MODES = (
    "ok",
    "numpy_nan",
    "numpy_scalars",
    "typo",
    "every_other",
    "none",
    "string",
    "nothing",
    "keyerror",
    "yields_list",
    "valueerror",
)
"""The ordinary mistakes of a user's trainable that :func:`hostile` makes, one per ``mode``."""


def returns_dict(config: Mapping[str, Any], data: Dataset, ctx: TrialContext) -> Any:
    """The mistake a generator cannot make: returns one dict instead of yielding one per
    epoch (refused before Ray starts; a run that bypasses that check fails its trials)."""
    return {"val_accuracy": float(config.get("x", 0.6))}


def hostile(config: Mapping[str, Any], data: Dataset, ctx: TrialContext) -> Iterator[Any]:
    """A trainable that makes the ``mode`` mistake of :data:`HOSTILE_MODES` (test the record).

    ``ok``: plain floats. ``numpy_nan``: NumPy scalars whose loss turns ``np.float32('nan')``
    at epoch 2. ``numpy_scalars``: ``np.float32`` and 0-d array values, all finite. ``typo``:
    ``accuracy`` instead of ``val_accuracy``. ``every_other``: the objective on odd epochs
    only. ``none``: the objective is ``None`` at epoch 2. ``string``: the objective is a
    string. ``nothing``: yields no epoch at all. ``keyerror``: reads a config key the space
    does not have (``learning_rate``). ``yields_list``: a list of numbers instead of a dict.
    ``valueerror``: raises the same ``ValueError`` at epoch 2, every attempt.
    """
    import numpy as np

    mode = str(config.get("mode", "ok"))
    if mode == "nothing":
        return
    if mode == "keyerror":
        config["learning_rate"]  # noqa: B018  (a key the space misspelled)
    for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
        if mode == "valueerror" and epoch == 2:
            raise ValueError("a bad batch")
        accuracy = 0.5 + 0.1 * epoch
        metrics: dict[str, Any] = {"val_accuracy": accuracy, "val_loss": 1.0 - accuracy}
        if mode == "numpy_nan":
            metrics = {
                "val_accuracy": np.float64(accuracy),
                "val_loss": np.float32("nan") if epoch >= 2 else np.float32(0.5),
            }
        elif mode == "numpy_scalars":
            metrics = {"val_accuracy": np.float32(accuracy), "val_loss": np.array(0.25)}
        elif mode == "typo":
            metrics = {"accuracy": accuracy, "loss": 1.0 - accuracy}
        elif mode == "every_other" and epoch % 2 == 0:
            metrics.pop("val_accuracy")
        elif mode == "none" and epoch == 2:
            metrics["val_accuracy"] = None
        elif mode == "string":
            metrics["val_accuracy"] = f"{accuracy:.2f}"
        yield [accuracy, 1.0 - accuracy] if mode == "yields_list" else metrics


SIDE_METRICS_DROPPED = ("info", "items", "nothing", "note", "np_vector", "vector")
"""What :func:`side_metrics` yields that is not a number (left out, named on the trial)."""


def side_metrics(config: Mapping[str, Any], data: Dataset, ctx: TrialContext) -> Iterator[Any]:
    """The objective as a float beside side metrics of every kind a user yields (PyTorch).

    Numbers: ``val_loss`` a 1-element tensor (``torch.tensor([x])``), ``step_loss`` a 0-d
    tensor, ``np_one`` a 1-element array, ``flag`` an ``np.bool_``. Not numbers (dropped):
    :data:`SIDE_METRICS_DROPPED`, among them a tensor and an array of several elements.
    """
    import numpy as np
    import torch

    for epoch in range(ctx.start_epoch, ctx.max_epochs + 1):
        accuracy = 0.5 + 0.1 * epoch
        yield {
            "val_accuracy": accuracy,
            "val_loss": torch.tensor([1.0 - accuracy]),
            "step_loss": torch.tensor(0.25),
            "np_one": np.array([3.0]),
            "flag": np.bool_(epoch % 2),
            "vector": torch.tensor([1.0, 2.0]),
            "np_vector": np.zeros(3),
            "note": f"epoch {epoch}",
            "items": [1, 2],
            "info": {"a": 1},
            "nothing": None,
        }
