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

from search.contract import BUILTIN
from search.contract.inputs import INPUTS_FILE, Declared, InputsError, read_inputs
from search.errors import one_line
from search.handover.lineage import lineage_lines
from search.report.html import summarize
from search.report.pngs import legend

if TYPE_CHECKING:
    import optuna

    from search.contract.dataset import Dataset
    from search.handover.confirm import ConfirmRun
    from search.specs.schema import DataSpec, StudySpec

PACKAGES = (
    "search",
    "ray",
    "optuna",
    "numpy",
    "pandas",
    "scikit-learn",
    "torch",
    "torchvision",
    "lightning",
    "pytorch-lightning",
    "torchmetrics",
    "transformers",
    "tokenizers",
    "accelerate",
    "tensorflow",
    "keras",
    "tf2onnx",
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


def environment(
    trainable: str, data: Dataset | None = None, data_spec: DataSpec | None = None
) -> str:
    """Python, packages, this tool's and the user's project's git commits, CPU and GPU, and
    the data's loader and fingerprint: what the bundle was made with and from
    (:mod:`search.handover.lineage`)."""
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
    lines += lineage_lines(trainable, data, data_spec)
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
    legend(left, fontsize=8)
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
        legend(twin, loc="center right", fontsize=8)
    legend(right, loc="upper right", fontsize=8)  # none when the model yields no loss
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


NOT_CHECKED = "not checked"
"""What the card writes for a number that is missing or NaN (a check that did not run)."""

STANDARD_FILES = {
    "config.yaml",
    "metrics.json",
    "environment.txt",
    "learning_curves.png",
    "MODEL_CARD.md",
    INPUTS_FILE,
}
"""The files every bundle has (the export command's and ``inputs.json``)."""


def _f(value: Any, digits: int = 4) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return NOT_CHECKED
        if value and abs(value) < 10**-digits:
            return f"{value:.2e}"
        return f"{value:.{digits}f}" if math.isfinite(value) else str(value)
    return "-" if value is None else str(value)


def _number(value: Any, fmt: str = ".4f") -> str:
    """``value`` formatted, or "not checked" when it is missing, not a number or NaN."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return NOT_CHECKED
    return format(value, fmt)


def _declared(out: Path) -> tuple[Declared | None, str]:
    """``inputs.json`` and, when it cannot be used, why."""
    try:
        return read_inputs(out), ""
    except InputsError as exc:
        return None, f"{INPUTS_FILE} is malformed ({one_line(str(exc))})"


def _input_lines(declared: Declared | None, problem: str) -> list[str]:
    if declared is None:
        why = f" ({problem})" if problem else ""
        return [f"- inputs: not declared by the export hook (not checked){why}."]
    lines = [f"- inputs of `{declared.model}`, as the export hook declared them (`{INPUTS_FILE}`):"]
    lines += [f"  - input {t.text()}" for t in declared.inputs]
    lines += [f"  - output {t.text()}" for t in declared.outputs]
    if declared.validation:
        lines.append(f"  - validation data for the check: `{declared.validation}`")
    return lines


def _inputs(
    out: Path,
    final: Mapping[str, Any],
    builtin: bool = True,
    declared: Declared | None = None,
    checked: Mapping[str, Any] | None = None,
) -> list[str]:
    """The ``Files`` lines of the model files: the built-in hooks' words for a built-in
    trainable, the declared inputs (or "not checked") for any other, with what export's run
    of ``search check`` (``checked``: ``metrics.json``'s ``onnx_check``) found."""
    scale = final.get("input_scale")
    onnx = declared.inputs if declared is not None and declared.model == "model.onnx" else ()
    names = ", ".join(f"`{t.name}`" for t in onnx)
    lines = []
    if (out / "model.onnx").exists():
        if builtin and not (out / "model.keras").exists():  # the PyTorch built-ins' words
            what = f"input {names or '`input`'}"
            lines.append(
                f"- `model.onnx`: {what}, float32 NCHW, values as the dataset holds them "
                "(the digits: 0 to 16; the scaling is inside the graph); output `logits` "
                "(argmax is the class), any batch size. Checked against PyTorch with "
                "onnxruntime: largest absolute difference "
                f"{_number(final.get('onnx_max_abs_diff'), '.2e')} (limit 1e-4), validation "
                f"accuracy {_number(final.get('onnx_val_accuracy'))}."
            )
        else:
            what = f"input {names}" if names else "inputs as its graph declares them"
            diff = final.get("onnx_max_abs_diff")
            compared = (
                "compared with the training framework (by the hook, or by export reloading "
                f"`model.keras`): largest absolute difference {_number(diff, '.2e')}"
                if _number(diff) != NOT_CHECKED
                else "its outputs not compared with the training framework's"
                if checked
                else "compared with the training framework: not checked"
            )
            lines.append(
                f"- `model.onnx`: {what} (see the inputs below); {compared}; "
                + _onnx_check(final, checked)
            )
        lines.append(
            "  `python -m search check .` (or `python scripts/check_onnx.py .`) runs it with "
            "onnxruntime alone, without the trainable's package."
        )
    if (out / "model.safetensors").exists():
        if builtin:
            lines.append(
                "- `model.safetensors`: the PyTorch `state_dict` (float32); rebuild the model "
                "with the trainable's `build_model` and "
                "`safetensors.torch.load_model(model, path)`."
            )
        else:
            lines.append(
                "- `model.safetensors`: PyTorch weights; load them into the trainable's own "
                "model with `safetensors.torch.load_model(model, path)`."
            )
    if (out / "model.keras").exists():
        how = (
            "input float32 NHWC scaled to [0, 1] (divide the dataset's values by "
            f"{_number(scale, '.1f')}); output class probabilities"
            if builtin
            else "inputs as declared below"
        )
        lines.append(f"- `model.keras`: `keras.models.load_model(path)`; {how}.")
    if (out / "saved_model").is_dir():
        lines.append(
            "- `saved_model/`: a TensorFlow SavedModel (`tf.saved_model.load`, signature "
            "`serve`), same input and output."
        )
    known = {"model.onnx", "model.safetensors", "model.keras", "saved_model"} | STANDARD_FILES
    others = sorted(
        p.name + ("/" if p.is_dir() else "") for p in out.iterdir() if p.name not in known
    )
    if others and not builtin:
        lines.append(f"- also written by the export hook: {', '.join(f'`{n}`' for n in others)}.")
    return lines


def _frameworks(metrics: Mapping[str, Any]) -> str:
    """``torch 2.14.1, lightning 2.6.0`` (``metrics.json``'s ``frameworks``), or ``none``."""
    return ", ".join(metrics.get("frameworks") or []) or "none of the known ones"


def _onnx_check(final: Mapping[str, Any], checked: Mapping[str, Any] | None) -> str:
    """The accuracy part of the ``model.onnx`` line: what export's ``search check`` compared
    (the ONNX model's validation accuracy with the framework's) and its verdict; without it,
    the hook's ``onnx_val_accuracy``."""
    if not checked:
        return f"validation accuracy with onnxruntime {_number(final.get('onnx_val_accuracy'))}."
    lines = [str(line) for line in checked.get("lines") or []]
    compared = next((x for x in lines if " vs " in x or x.startswith("validation accuracy")), "")
    found = f"`{compared}`; " if compared else ""
    return f"export ran `python -m search check` on it: {found}{checked.get('verdict', '')}."


def _fingerprint(metrics: Mapping[str, Any]) -> str:
    """The data's fingerprint (``metrics.json``'s ``data_fingerprint``), or nothing."""
    found = metrics.get("data_fingerprint")
    if not found:
        return ""
    return (
        f"\n  Data fingerprint: `{found}` (the registry's `search.data_fingerprint` is the same)."
    )


def _short(metrics: Mapping[str, Any]) -> str:
    """A paragraph when fewer confirmation runs ended with a value than were asked for."""
    line = metrics.get("confirmation_shortfall")
    return f"\n\n**Fewer confirmation runs than asked:** {line}." if line else ""


def _data_line(spec: StudySpec) -> str:
    """What the study trained on, as the spec says it (a loader splits its data itself)."""
    data = spec.data
    if data.loader is not None:
        args = ", ".join(f"{k}={v!r}" for k, v in data.args.items())
        return f"loaded by `{data.loader}({args})`, which made the validation split."
    if data.name == "none":
        return "loaded by the trainable itself (the spec declares no `data:`)."
    return f"`{data.name}`, validation fraction {data.val_fraction}, split seed {data.split_seed}."


def model_card(study: optuna.Study, spec: StudySpec, metrics: Mapping[str, Any], out: Path) -> str:
    """``MODEL_CARD.md``: what the model is, how it was chosen, how well it does, how to use it."""

    metric, mode = spec.primary.metric, spec.primary.mode
    final: Mapping[str, float] = metrics["final"]
    chosen = metrics["chosen"]
    rows = metrics["confirmation"]
    summary = summarize(study)
    seeds = metrics["seeds"]
    builtin = spec.trainable in BUILTIN
    declared, problem = _declared(out)
    checked = metrics.get("onnx_check")
    files = _inputs(out, final, builtin, declared, checked) + _input_lines(declared, problem)
    what = (
        f"A `{spec.trainable}` model for `{spec.data.name}` classification"
        if builtin
        else f"A model of the trainable `{spec.trainable}`"
    )
    data_note = (
        ""
        if builtin
        else " A trainable of its own may read other data than the spec names; this card "
        "describes only what the spec and the export hook declared."
    )
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

{what}, the winner of the
hyperparameter study `{spec.study}` ({summary.trials} trials), confirmed with
{len(seeds)} fresh seeds and trained once more for {spec.budget.max_epochs} epochs.

**Final model:** {metric} **{_f(final.get(metric))}** on the validation split
({mode} is better); the config's confirmed mean is **{_f(rows[0]["mean"])} ± {_f(rows[0]["std"])}**
(sample standard deviation over {len(seeds) - rows[0]["failed"]} seeds).{_short(metrics)}

## Files

- `config.yaml`: the whole config as a spec (seed {chosen["seed"]}, every knob of the
  trainable). `python -m search train config.yaml` trains it again without Ray and reaches
  the {metric} above within {metrics["tolerance"]} (exactly, on the same machine and threads);
  `python -m search run config.yaml` trains it as a one-trial study.
{chr(10).join(files)}
- `metrics.json`: the confirmation table, the final metrics and the final run's curve.
- `environment.txt`: Python, packages, git commits (this tool's and the trainable's
  project), CPU and GPU, the data's loader and fingerprint, and
  the frameworks the final model was trained with: {_frameworks(metrics)}.{_fingerprint(metrics)}

## How it was chosen

1. The search (`{spec.sampler.name}` sampler, ASHA {"on" if spec.asha.enabled else "off"}):

| | |
|---|---|
{search_rows}

2. The top {len(rows)} distinct COMPLETE configs were trained again at the full budget with the
   seeds {", ".join(map(str, seeds))} (no search trial used them), as study
   `{metrics["confirm_study"]}` in `{metrics.get("confirm_storage", "the study's storage")}`.
   The config with the fewest failed runs and then the best mean won:

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

- The validation split chose the config (search and confirmation), so its {metric} is a
  slightly optimistic estimate; there is no separate test split in the spec. The confirmed
  mean over fresh seeds is the fairer number.
- Data: {_data_line(spec)} The model has not been evaluated on any other data.{data_note}
- Export took {metrics["export_seconds"]} s.
"""
