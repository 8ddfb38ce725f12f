"""The final model and the bundle (steps 4 and 5 of ``export``; see
:mod:`search.handover.export`).

:func:`write_bundle` trains the chosen config once more, in this process, through its
trainable's export hook, with the seed of its median confirmation run, and writes
``config.yaml``, the hook's model files, ``metrics.json``, ``environment.txt``,
``learning_curves.png`` and ``MODEL_CARD.md``. The plain export, ``--pick`` and each point of
``--pareto`` all write their bundles through it.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from search.contract import BUILTIN
from search.errors import SearchError, one_line
from search.handover import card, check, compare
from search.handover.candidates import resolved_config
from search.handover.confirm import ConfirmRun, Row, median_seed, shortfall
from search.handover.lineage import data_fingerprint, frameworks
from search.handover.train import Log, train_spec
from search.record.storage import redact
from search.record.study import CONFIRM_FILE
from search.specs.derive import one_trial_spec
from search.specs.schema import parse_spec

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import optuna

    from search.contract.dataset import Dataset
    from search.specs.schema import StudySpec

TOLERANCE = 0.02
"""How close ``python -m search train config.yaml`` must come to the exported metric."""

FINAL_SUFFIX = "-final"


@dataclass(frozen=True)
class Session:
    """What every flavour of export shares once the study is loaded and Ray is up."""

    study: optuna.Study
    spec: StudySpec  # resources resolved (:func:`search.handover.export.with_placement`)
    seeds: list[int]
    confirm: optuna.Study
    data: Dataset
    address: str | None
    log: Log
    start: float


@dataclass(frozen=True)
class ExportResult:
    """What ``export`` wrote and measured."""

    out_dir: Path
    rows: list[Row]
    chosen: Row
    seed: int
    final: dict[str, float]
    seconds: float


def confirmed_metrics(
    row: Row, runs: Sequence[ConfirmRun], metrics: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Per metric, the confirmed mean, sample std, min, max and failed runs of ``row``'s
    config (a run without the metric counts as failed for it)."""
    found = {}
    for metric in metrics:
        values = {r.seed: r.value(metric) for r in runs if r.source_trial == row.source_trial}
        stats = Row(row.source_trial, math.nan, values, row.params).as_dict()
        found[metric] = {k: stats[k] for k in ("mean", "std", "min", "max", "failed")}
    return found


def write_bundle(
    session: Session,
    chosen: Row,
    rows: Sequence[Row],
    runs: Sequence[ConfirmRun],
    out: Path,
    suffix: str = FINAL_SUFFIX,
    extra: Mapping[str, Any] | None = None,
    card_note: str = "",
    label: str = "chose",
) -> ExportResult:
    """Trains ``chosen`` once more through the export hook and writes the bundle in ``out``.

    Args:
        rows: The confirmation table the bundle shows (``chosen`` among them).
        suffix: Appended to the study name in ``config.yaml`` (its own study when run).
        extra: More entries for ``metrics.json``.
        card_note: Markdown appended to ``MODEL_CARD.md``.
        label: The first word of the log line that names the config (``chose trial 3: ...``).
    """
    spec, metric = session.spec, session.spec.primary.metric
    seed = median_seed(chosen)
    config = resolved_config(spec, chosen.params)
    session.log(
        f"{label} trial {chosen.source_trial}: {metric} mean {chosen.mean:.4f} "
        f"± {chosen.std:.4f} over {len(chosen.ok)} seeds; final model with seed {seed}"
    )
    bundle = one_trial_spec(spec, config, seed, suffix, redact(spec.storage))
    history: list[dict[str, float]] = []
    out.mkdir(parents=True, exist_ok=True)
    final = train_spec(
        parse_spec(bundle, "config.yaml"), out, log=None, history=history, data=session.data
    )
    if "onnx_max_abs_diff" not in final:
        final = {**final, **_onnx_checked(out, session.log)}
    twin = chosen.values.get(seed)
    value = f"{metric} {final.get(metric, math.nan):.4f}"
    same = f" (its confirmation run with seed {seed}: {twin:.4f})" if twin is not None else ""
    session.log(f"final model {value}{same}")
    (out / "config.yaml").write_text(
        _config_header(session, chosen, seed, final) + yaml.safe_dump(bundle, sort_keys=False)
    )
    seconds = time.monotonic() - session.start
    metrics = _metrics(session, chosen, rows, config, seed, final, history, seconds)
    asked = len(rows) * len(session.seeds)
    short = shortfall(runs, asked, spec.primary.metric, session.confirm.study_name)
    if short is not None:  # said on the console as the runs ended; the card says it too
        metrics["confirmation_shortfall"] = short
    metrics.update(extra or {})
    _write_files(session, out, metrics, runs, chosen.source_trial, card_note)
    session.log(
        f"{value} (final model); bundle in {out}/ "
        f"({', '.join(sorted(p.name for p in out.iterdir()))}) in {seconds:.0f} s"
    )
    return ExportResult(out, list(rows), chosen, seed, final, seconds)


def _onnx_checked(out: Path, log: Log) -> dict[str, float]:
    """A user's hook wrote ``model.onnx`` and ``model.keras``: compare them
    (:mod:`search.handover.compare`), logging a difference over its tolerance or a failure."""
    try:
        found = compare.onnx_against_keras(out)
    except ValueError as exc:
        log(f"warning: {exc}")
        return {}
    diff = found.get("onnx_max_abs_diff", 0.0)
    if diff > compare.TOLERANCE:
        log(f"warning: model.onnx differs from model.keras by {diff:.3g} (> {compare.TOLERANCE})")
    return found


def _write_files(
    session: Session,
    out: Path,
    metrics: Mapping[str, Any],
    runs: Sequence[ConfirmRun],
    chosen: int,
    card_note: str,
) -> None:
    """``metrics.json``, ``environment.txt``, ``learning_curves.png`` and ``MODEL_CARD.md``."""
    spec = session.spec
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
    if spec.trainable not in BUILTIN and (out / "model.onnx").is_file():  # built-ins check theirs
        metrics = {**metrics, "onnx_check": _onnx_check(out, session.log)}
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
    (out / "environment.txt").write_text(card.environment(spec.trainable, session.data, spec.data))
    history = metrics["final_history"]
    card.learning_curves(out / "learning_curves.png", runs, chosen, history, spec.primary.metric)
    text = card.model_card(session.study, spec, metrics, out)
    (out / "MODEL_CARD.md").write_text(text + (f"\n{card_note}" if card_note else ""))


def _onnx_check(out: Path, log: Log) -> dict[str, Any]:
    """``python -m search check`` on the bundle just written (onnxruntime alone, as a user
    would run it): ``{"verdict": ..., "lines": [...]}`` for ``metrics.json`` and the card; a
    mismatch, or a bundle it cannot check, is also logged."""
    try:
        lines = check.check_bundle(out)
        verdict = lines[-1] if lines else "OK"
    except check.BundleCheckFailed as exc:
        lines, verdict = exc.lines, f"MISMATCH: {one_line(exc)}"
    except SearchError as exc:
        lines, verdict = [], f"not checked: {one_line(exc)}"
    if not verdict.startswith("OK"):
        log(f"warning: search check {out}: {verdict}")
    return {"verdict": verdict, "lines": lines}


def _config_header(session: Session, chosen: Row, seed: int, final: Mapping[str, float]) -> str:
    metric = session.spec.primary.metric
    return (
        f"# exported from study {session.study.study_name!r}, trial {chosen.source_trial}, "
        f"seed {seed}\n# confirmed {metric} {chosen.mean:.4f} ± {chosen.std:.4f} "
        f"({len(chosen.ok)} seeds); this run: {final.get(metric, math.nan):.4f}\n"
        f"# python -m search train config.yaml reproduces it within {TOLERANCE}\n"
    )


def _metrics(
    session: Session,
    chosen: Row,
    rows: Sequence[Row],
    config: Mapping[str, Any],
    seed: int,
    final: Mapping[str, float],
    history: Sequence[Mapping[str, float]],
    seconds: float,
) -> dict[str, Any]:
    """``metrics.json``: the confirmation table, the final metrics and curve."""
    spec = session.spec
    found: dict[str, Any] = {
        "study": session.study.study_name,
        "trainable": spec.trainable,
        "objective": {"metric": spec.primary.metric, "mode": spec.primary.mode},
    }
    if spec.multi_objective:
        found["objectives"] = [{"metric": o.metric, "mode": o.mode} for o in spec.objectives]
    return found | {
        "confirm_study": session.confirm.study_name,
        "confirm_storage": f"{session.study.study_name}/{CONFIRM_FILE}",  # under --results
        "seeds": session.seeds,
        "max_epochs": spec.budget.max_epochs,
        "chosen": {"source_trial": chosen.source_trial, "seed": seed, "config": dict(config)},
        "confirmation": [r.as_dict() for r in rows],
        "final": dict(final),
        "tolerance": TOLERANCE,
        "final_seed_confirmation_value": chosen.values.get(seed),
        "final_history": list(history),
        "export_seconds": round(seconds, 1),
        "frameworks": frameworks(),  # imported by the final model's training, just done
        **({} if session.data is None else {"data_fingerprint": data_fingerprint(session.data)}),
    }
