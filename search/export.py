"""Hand over the winner: confirm the best configs with fresh seeds, retrain, write a bundle.

``python -m search export STUDY`` does, in order:

1. to 3. **Candidates, confirmation, choice** (:mod:`search.confirm`): the top ``K`` COMPLETE
   trials, each trained again with ``S`` fresh seeds as Ray tasks with one trial's resources
   (:func:`with_placement`), recorded in the study ``<study>-confirm``; the candidate with the
   fewest failed runs, then the best mean, wins.
4. **Final model**: the chosen config is trained once more, in this process, through its
   trainable's export hook (:func:`search.trainable.resolve_exporter`), with the seed of its
   median confirmation run, on the same training split. The validation split is kept apart
   (not merged into training): it is the only held-out data a spec has, the schedules and
   early stopping read its loss, and the exported accuracy must be reproducible by
   ``python -m search train DIR/config.yaml`` and by the ONNX model on the same split.
5. **Bundle** in ``DIR``: ``config.yaml`` (a spec: the whole config with every knob of the
   trainable, the seed, data, budget; ``run`` and ``train`` accept it), the model files the
   hook writes, ``metrics.json``, ``environment.txt``, ``learning_curves.png`` and
   ``MODEL_CARD.md`` (:mod:`search.card`).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from search.confirm import (
    ExportError,
    Log,
    Row,
    candidates,
    confirm_study,
    confirmation_seeds,
    confirmation_table,
    median_seed,
    resolved_config,
    run_confirmation,
    stored_spec,
    trial_context,
)

if TYPE_CHECKING:
    from search.spec import StudySpec

TOLERANCE = 0.02
"""How close ``python -m search train config.yaml`` must come to the exported metric."""

FINAL_SUFFIX = "-final"


# --- the final model and the bundle ----------------------------------------------------------


def local_device(spec: StudySpec) -> str:
    """``cuda`` when the spec asks for GPUs and this process sees one, else ``cpu``."""
    wanted = spec.resources.gpus_per_trial
    if wanted != "auto" and not float(wanted or 0) > 0:
        return "cpu"
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        pass
    try:
        import tensorflow as tf

        return "cuda" if tf.config.list_physical_devices("GPU") else "cpu"
    except ImportError:
        return "cpu"


def with_placement(spec: StudySpec) -> StudySpec:
    """``spec`` with its ``resources`` resolved on this Ray cluster into plain numbers.

    ``cpus_per_trial`` unset or ``gpus_per_trial: auto`` become what a trial got (see
    :mod:`search.placement`), so the confirmation runs, the final run and ``config.yaml``
    (which ``train`` reads without Ray) use the same threads. Every run here is one process:
    a data-parallel spec (``workers_per_trial``) is confirmed on one worker.
    """
    import ray

    from search.spec import parse_spec

    one_process = spec.resources
    if getattr(one_process, "workers_per_trial", None):
        one_process = one_process.model_copy(update={"workers_per_trial": None})
    try:
        from search.placement import resolve

        placement = resolve(one_process, ray.cluster_resources(), data_parallel=False)
        cpus, gpus = float(placement.cpus_per_trial), float(placement.gpus_per_trial)
    except (ImportError, TypeError, AttributeError):  # a placement module of another shape
        cpus = float(spec.resources.cpus_per_trial or 1.0)
        wanted = spec.resources.gpus_per_trial
        gpus = 0.0 if wanted == "auto" else float(wanted or 0.0)
    data = spec.to_dict()
    data["resources"] = {**data["resources"], "cpus_per_trial": cpus, "gpus_per_trial": gpus}
    data["resources"].pop("workers_per_trial", None)
    return parse_spec(data, f"study {spec.study!r}: spec (resources resolved)")


def final_spec(spec: StudySpec, config: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """The bundle's ``config.yaml``: a spec of one trial that trains ``config`` with ``seed``."""
    from search.storage import redact

    data = spec.to_dict()
    data["study"] = f"{spec.study}{FINAL_SUFFIX}"
    data["fixed"] = dict(config)
    data["space"] = {}
    data["budget"] = {k: v for k, v in data["budget"].items() if k != "time_limit_s"}
    data["budget"]["trials"] = 1
    data["asha"] = {**data["asha"], "enabled": False}
    data["sampler"] = {"name": "random", "seed": seed}
    data["storage"] = redact(spec.storage)
    data.pop("profile", None)
    data.pop("profile_trial", None)
    return data


def train_spec(spec: StudySpec, out_dir: Path | None = None, log: Log | None = None,
               history: list[dict[str, float]] | None = None) -> dict[str, float]:
    """Trains a spec of fixed parameters once, in this process (no Ray), seed ``sampler.seed``.

    With ``out_dir``, the trainable's export hook trains and saves the model there.

    Returns:
        The last epoch's metrics (and what the export hook adds).

    Raises:
        ExportError: When the spec still has a search space, or ``out_dir`` is given and the
            trainable has no export hook.
    """
    from search.data import load_data
    from search.record import nonfinite_reason
    from search.trainable import resolve_exporter, resolve_trainable

    if spec.space:
        raise ExportError(f"space: train takes a spec of fixed parameters (export's "
                          f"config.yaml, best.yaml); this one searches {sorted(spec.space)}")
    config = dict(spec.fixed)
    seed = spec.sampler.seed or 0
    data = load_data(spec.data)
    history = [] if history is None else history
    with tempfile.TemporaryDirectory(prefix="search-train-") as folder:
        ctx = trial_context(spec, data, seed, 0, local_device(spec), folder, history=history)
        if out_dir is not None:
            export = resolve_exporter(spec.trainable)
            if export is None:
                raise ExportError(no_hook(spec.trainable))
            final = export(config, data, ctx, Path(out_dir))
            for epoch, metrics in enumerate(history, start=1):
                if log:
                    log(epoch_line(epoch, metrics, spec))
        else:
            final = {}
            for epoch, metrics in enumerate(resolve_trainable(spec.trainable)(config, data, ctx),
                                            start=1):
                history.append(dict(metrics))
                final = dict(metrics)
                if log:
                    log(epoch_line(epoch, metrics, spec))
                if nonfinite_reason(metrics, epoch) or epoch >= spec.budget.max_epochs:
                    break
    reason = nonfinite_reason(final, len(history)) if final else "no epoch trained"
    if reason:
        raise ExportError(f"training {spec.study!r} failed: {reason}")
    return {k: float(v) for k, v in final.items()}


def epoch_line(epoch: int, metrics: Mapping[str, float], spec: StudySpec) -> str:
    """``epoch   3 val_accuracy=0.9722 val_loss=0.0950 train_loss=0.1234``."""
    keys = [spec.objective.metric] + [k for k in ("val_loss", "train_loss")
                                      if k != spec.objective.metric]
    shown = " ".join(f"{k}={metrics[k]:.4f}" for k in keys if k in metrics)
    return f"epoch {epoch:>3} {shown}"


def no_hook(trainable: str) -> str:
    return (f"trainable {trainable!r} has no export hook: define export(config, data, ctx, "
            "out_dir) next to its train function (see search/trainable.py)")


@dataclass(frozen=True)
class ExportResult:
    """What ``export`` wrote and measured."""

    out_dir: Path
    rows: list[Row]
    chosen: Row
    seed: int
    final: dict[str, float]
    seconds: float


def export_study(study_name: str, storage: str, out_dir: Path | None = None, top_k: int = 3,
                 seeds: int = 3, address: str | None = None, results_dir: Path = Path("results"),
                 log: Log = print) -> ExportResult:
    """The whole ``export`` command (module docstring); returns what it wrote and measured."""
    import optuna

    from search import card
    from search.data import load_data
    from search.runner import init_ray
    from search.spec import parse_spec
    from search.study import load_study
    from search.trainable import resolve_exporter

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.monotonic()
    study = load_study(study_name, storage)
    spec = stored_spec(study, storage)
    cands = candidates(study, top_k)
    if resolve_exporter(spec.trainable) is None:
        raise ExportError(no_hook(spec.trainable))
    out = Path(out_dir) if out_dir else results_dir / study_name / "export"
    out.mkdir(parents=True, exist_ok=True)
    init_ray(address)
    spec = with_placement(spec)
    seed_list = confirmation_seeds(spec, seeds)
    log(f"confirming {len(cands)} config(s) (trials {', '.join(str(c.number) for c in cands)}) "
        f"with seeds {', '.join(map(str, seed_list))} at {spec.budget.max_epochs} epochs")
    confirm = confirm_study(study, storage)
    data = load_data(spec.data)
    runs = run_confirmation(spec, cands, seed_list, confirm, data, address, log)
    rows = confirmation_table(cands, seed_list, runs, spec.objective.metric, spec.objective.mode)
    chosen = rows[0]
    if not chosen.ok:
        raise ExportError(f"every confirmation run failed (see study "
                          f"{confirm.study_name!r}: fail_reason)")
    seed = median_seed(chosen)
    config = resolved_config(spec, chosen.params)
    log(f"chose trial {chosen.source_trial}: {spec.objective.metric} mean {chosen.mean:.4f} "
        f"± {chosen.std:.4f} over {len(chosen.ok)} seeds; final model with seed {seed}")
    bundle = final_spec(spec, config, seed)
    parse_spec(bundle, "config.yaml")  # the bundle's spec must validate before it is written
    history: list[dict[str, float]] = []
    final = train_spec(parse_spec(bundle, "config.yaml"), out, log=None, history=history)
    metric = spec.objective.metric
    twin = chosen.values.get(seed)
    log(f"final model {metric} {final.get(metric, math.nan):.4f} (its confirmation run with "
        f"seed {seed}: {twin:.4f})")
    header = (f"# exported from study {study_name!r}, trial {chosen.source_trial}, seed {seed}\n"
              f"# confirmed {metric} {chosen.mean:.4f} ± {chosen.std:.4f} "
              f"({len(chosen.ok)} seeds); this run: {final.get(metric, math.nan):.4f}\n"
              f"# python -m search train config.yaml reproduces it within {TOLERANCE}\n")
    (out / "config.yaml").write_text(header + yaml.safe_dump(bundle, sort_keys=False))
    seconds = time.monotonic() - start
    result = ExportResult(out, rows, chosen, seed, final, seconds)
    metrics = {
        "study": study_name, "trainable": spec.trainable,
        "objective": {"metric": metric, "mode": spec.objective.mode},
        "confirm_study": confirm.study_name, "seeds": seed_list,
        "max_epochs": spec.budget.max_epochs,
        "chosen": {"source_trial": chosen.source_trial, "seed": seed, "config": config},
        "confirmation": [r.as_dict() for r in rows],
        "final": final, "tolerance": TOLERANCE, "final_seed_confirmation_value": twin,
        "final_history": history,
        "export_seconds": round(seconds, 1),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
    (out / "environment.txt").write_text(card.environment(spec.trainable))
    card.learning_curves(out / "learning_curves.png", runs, chosen.source_trial, history, metric)
    (out / "MODEL_CARD.md").write_text(card.model_card(study, spec, metrics, out))
    log(f"{metric} {final.get(metric, math.nan):.4f} (final model); bundle in {out}/ "
        f"({', '.join(sorted(p.name for p in out.iterdir()))}) in {seconds:.0f} s")
    return result
