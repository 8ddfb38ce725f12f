"""The human side of an export bundle: environment.txt, learning_curves.png, MODEL_CARD.md."""

from __future__ import annotations

import importlib.metadata
import math
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.report.html import summarize

if TYPE_CHECKING:
    import optuna

    from search.handover.confirm import ConfirmRun
    from search.spec.schema import StudySpec

PACKAGES = (
    "search",
    "ray",
    "optuna",
    "numpy",
    "pandas",
    "scikit-learn",
    "torch",
    "torchvision",
    "tensorflow",
    "keras",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "safetensors",
    "matplotlib",
    "plotly",
    "pydantic",
)


def _git(*args: str) -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> str:
    if shutil.which("nvidia-smi"):
        try:
            done = subprocess.run(
                ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=False
            )
            if done.returncode == 0 and done.stdout.strip():
                return "; ".join(done.stdout.strip().splitlines())
        except (OSError, subprocess.TimeoutExpired):
            pass
    return "none"


def environment(trainable: str) -> str:
    """Python, packages, git commit, CPU and GPU: what the bundle was made with."""
    lines = [
        f"python {sys.version.split()[0]} ({sys.executable})",
        f"platform {platform.platform()}",
        f"cpu {_cpu()} ({os.cpu_count()} logical cores)",
        f"gpu {_gpus()}",
        f"trainable {trainable}",
    ]
    commit = _git("rev-parse", "HEAD")
    if commit:
        dirty = " (with uncommitted changes)" if _git("status", "--porcelain") else ""
        lines.append(f"git {commit}{dirty}")
    else:
        lines.append("git none (not a git checkout)")
    lines.append("")
    for name in PACKAGES:
        try:
            lines.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return "\n".join(lines) + "\n"


def learning_curves(
    path: Path,
    runs: Sequence[ConfirmRun],
    chosen: int,
    history: Sequence[Mapping[str, float]],
    metric: str,
) -> Path:
    """Left: the objective of every confirmation run (chosen config bold); right: the final
    model's losses and objective per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.get_cmap("tab10")
    sources = sorted({r.source_trial for r in runs}, key=lambda n: (n != chosen, n))
    for i, source in enumerate(sources):
        for j, run in enumerate(r for r in runs if r.source_trial == source):
            ys = [row.get(metric, math.nan) for row in run.history]
            label = f"trial {source}" + (" (chosen)" if source == chosen else "")
            left.plot(
                range(1, len(ys) + 1),
                ys,
                color=colors(i % 10),
                linewidth=2.2 if source == chosen else 1.0,
                alpha=0.9 if source == chosen else 0.6,
                label=label if j == 0 else None,
            )
    left.set(
        title=f"Confirmation runs: {metric} per epoch, one line a seed",
        xlabel="epoch",
        ylabel=metric,
    )
    left.grid(alpha=0.3)
    if runs:
        left.legend(fontsize=8)
    epochs = range(1, len(history) + 1)
    for key, style in (("train_loss", "--"), ("val_loss", "-")):
        if any(key in row for row in history):
            right.plot(epochs, [row.get(key, math.nan) for row in history], style, label=key)
    right.set(title="Final model", xlabel="epoch", ylabel="loss")
    right.grid(alpha=0.3)
    if "loss" not in metric and history:
        twin = right.twinx()
        twin.plot(
            epochs, [row.get(metric, math.nan) for row in history], color="green", label=metric
        )
        twin.set_ylabel(metric)
        twin.legend(loc="center right", fontsize=8)
    if history:
        right.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _f(value: Any, digits: int = 4) -> str:
    if isinstance(value, float):
        if value and abs(value) < 10**-digits:
            return f"{value:.2e}"
        return f"{value:.{digits}f}" if math.isfinite(value) else str(value)
    return "-" if value is None else str(value)


def _inputs(out: Path, final: Mapping[str, float]) -> list[str]:
    scale = final.get("input_scale")
    lines = []
    if (out / "model.onnx").exists():
        lines += [
            "- `model.onnx`: input `input`, float32 NCHW, values as the dataset holds them "
            "(the digits: 0 to 16; the scaling is inside the graph); output `logits` "
            "(argmax is the class), any batch size. Checked against PyTorch with onnxruntime: "
            f"largest absolute difference {final.get('onnx_max_abs_diff', math.nan):.2e} "
            f"(limit 1e-4), validation accuracy {_f(final.get('onnx_val_accuracy'))}.",
            "- `model.safetensors`: the PyTorch `state_dict` (float32); rebuild the model with "
            "the trainable's `build_model` and `safetensors.torch.load_model(model, path)`.",
        ]
    if (out / "model.keras").exists():
        lines += [
            "- `model.keras`: `keras.models.load_model(path)`; input float32 NHWC scaled to "
            f"[0, 1] (divide the dataset's values by {_f(scale, 1)}); output class probabilities.",
            "- `saved_model/`: a TensorFlow SavedModel (`tf.saved_model.load`, signature `serve`),"
            " same input and output.",
        ]
    return lines


def model_card(study: optuna.Study, spec: StudySpec, metrics: Mapping[str, Any], out: Path) -> str:
    """``MODEL_CARD.md``: what the model is, how it was chosen, how well it does, how to use it."""

    metric, mode = spec.objective.metric, spec.objective.mode
    final: Mapping[str, float] = metrics["final"]
    chosen = metrics["chosen"]
    rows = metrics["confirmation"]
    summary = summarize(study)
    seeds = metrics["seeds"]
    table = [
        f"| source trial | search {metric} | "
        + " | ".join(f"seed {s}" for s in seeds)
        + " | mean | std | min | max |",
        "|---" * (len(seeds) + 6) + "|",
    ]
    for row in rows:
        mark = " **(chosen)**" if row["source_trial"] == chosen["source_trial"] else ""
        values = " | ".join(
            _f(row["values"][str(s)]) if row["values"][str(s)] is not None else "FAIL"
            for s in seeds
        )
        table.append(
            f"| {row['source_trial']}{mark} | {_f(row['search_value'])} | {values} | "
            f"{_f(row['mean'])} | {_f(row['std'])} | {_f(row['min'])} | "
            f"{_f(row['max'])} |"
        )
    params = "\n".join(f"| `{k}` | `{v}` |" for k, v in chosen["config"].items())
    search_rows = "\n".join(f"| {label} | {value} |" for label, value in summary.rows())
    final_rows = "\n".join(f"| {k} | {_f(v)} |" for k, v in final.items())
    return f"""# Model card: {spec.study}

A `{spec.trainable}` model for `{spec.data.name}` classification, the winner of the
hyperparameter study `{spec.study}` ({summary.trials} trials), confirmed with
{len(seeds)} fresh seeds and trained once more for {spec.budget.max_epochs} epochs.

**Final model:** {metric} **{_f(final.get(metric))}** on the validation split
({mode} is better); the config's confirmed mean is **{_f(rows[0]["mean"])} ± {_f(rows[0]["std"])}**
(sample standard deviation over {len(seeds) - rows[0]["failed"]} seeds).

## Files

- `config.yaml`: the whole config as a spec (seed {chosen["seed"]}, every knob of the
  trainable). `python -m search train config.yaml` trains it again without Ray and reaches
  the {metric} above within {metrics["tolerance"]} (exactly, on the same machine and threads);
  `python -m search run config.yaml` trains it as a one-trial study.
{chr(10).join(_inputs(out, final))}
- `metrics.json`: the confirmation table, the final metrics and the final run's curve.
- `environment.txt`: Python, packages, git commit, CPU and GPU.

## How it was chosen

1. The search (`{spec.sampler.name}` sampler, ASHA {"on" if spec.asha.enabled else "off"}):

| | |
|---|---|
{search_rows}

2. The top {len(rows)} distinct COMPLETE configs were trained again at the full budget with the
   seeds {", ".join(map(str, seeds))} (no search trial used them), as study
   `{metrics["confirm_study"]}` in the same storage. The config with the fewest failed runs
   and then the best mean won:

{chr(10).join(table)}

3. The winner (search trial {chosen["source_trial"]}) was trained once more with the seed of
   its median confirmation run ({chosen["seed"]}) on the training split; the validation
   split stays held out, so the numbers below are measured on data the model never trained on.

![learning curves](learning_curves.png)

## Final metrics

| metric | value |
|---|---|
{final_rows}

## Config

| key | value |
|---|---|
{params}

## Limits

- The validation split chose the config (search and confirmation), so its accuracy is a
  slightly optimistic estimate; there is no separate test split in the spec. The confirmed
  mean over fresh seeds is the fairer number.
- Data: `{spec.data.name}`, validation fraction {spec.data.val_fraction}, split seed
  {spec.data.split_seed}. The model has not been evaluated on any other data.
- Export took {metrics["export_seconds"]} s.
"""
