"""Hand over the winner: confirm the best configs with fresh seeds, retrain, write a bundle.

``python -m search export STUDY`` does, in order:

1. to 3. **Candidates, confirmation, choice** (:mod:`search.handover.confirm`): the top ``K``
   COMPLETE trials, each trained again with ``S`` fresh seeds as Ray tasks with one trial's
   resources (:func:`with_placement`), recorded in the study ``<study>-confirm``; the candidate
   with the fewest failed runs, then the best mean, wins.
4. **Final model** (:mod:`search.handover.train`): the chosen config is trained once more, in
   this process, through its trainable's export hook, with the seed of its
   median confirmation run, on the same training split. The validation split is kept apart
   (not merged into training): it is the only held-out data a spec has, the schedules and
   early stopping read its loss, and the exported accuracy must be reproducible by
   ``python -m search train DIR/config.yaml`` and by the ONNX model on the same split.
5. **Bundle** in ``DIR``: ``config.yaml`` (a spec: the whole config with every knob of the
   trainable, the seed, data, budget; ``run`` and ``train`` accept it), the model files the
   hook writes, ``metrics.json``, ``environment.txt``, ``learning_curves.png`` and
   ``MODEL_CARD.md`` (:mod:`search.handover.card`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from search.contract import declarations
from search.handover import card
from search.handover.confirm import (
    Row,
    candidates,
    confirm_study,
    confirmation_seeds,
    confirmation_table,
    median_seed,
    resolved_config,
    run_confirmation,
    stored_spec,
)
from search.handover.train import ExportError, Log, no_hook, train_spec
from search.record.storage import redact
from search.record.study import load_study
from search.run.cluster import init_ray
from search.run.data import load_data
from search.run.placement import resolve
from search.spec.derive import one_trial_spec
from search.spec.schema import parse_spec

if TYPE_CHECKING:
    from search.spec.schema import StudySpec

TOLERANCE = 0.02
"""How close ``python -m search train config.yaml`` must come to the exported metric."""

FINAL_SUFFIX = "-final"


# --- the final model and the bundle ----------------------------------------------------------


def with_placement(spec: StudySpec) -> StudySpec:
    """``spec`` with its ``resources`` resolved on this Ray cluster into plain numbers.

    ``cpus_per_trial`` unset or ``gpus_per_trial: auto`` become what a trial got (see
    :mod:`search.run.placement`), so the confirmation runs, the final run and ``config.yaml``
    (which ``train`` reads without Ray) use the same threads. Every run here is one process:
    a data-parallel spec (``workers_per_trial``) is confirmed on one worker.
    """
    import ray

    one_process = spec.resources
    if getattr(one_process, "workers_per_trial", None):
        one_process = one_process.model_copy(update={"workers_per_trial": None})
    placement = resolve(one_process, ray.cluster_resources(), data_parallel=False)
    cpus, gpus = float(placement.cpus_per_trial), float(placement.gpus_per_trial)
    data = spec.to_dict()
    data["resources"] = {**data["resources"], "cpus_per_trial": cpus, "gpus_per_trial": gpus}
    data["resources"].pop("workers_per_trial", None)
    return parse_spec(data, f"study {spec.study!r}: spec (resources resolved)")


@dataclass(frozen=True)
class ExportResult:
    """What ``export`` wrote and measured."""

    out_dir: Path
    rows: list[Row]
    chosen: Row
    seed: int
    final: dict[str, float]
    seconds: float


def export_study(
    study_name: str,
    storage: str,
    out_dir: Path | None = None,
    top_k: int = 3,
    seeds: int = 3,
    address: str | None = None,
    results_dir: Path = Path("results"),
    log: Log = print,
) -> ExportResult:
    """The whole ``export`` command (module docstring); returns what it wrote and measured."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.monotonic()
    study = load_study(study_name, storage)
    spec = stored_spec(study, storage)
    cands = candidates(study, top_k)
    if declarations(spec.trainable).export is None:
        raise ExportError(no_hook(spec.trainable))
    out = Path(out_dir) if out_dir else results_dir / study_name / "export"
    out.mkdir(parents=True, exist_ok=True)
    init_ray(address)
    spec = with_placement(spec)
    seed_list = confirmation_seeds(spec, seeds)
    log(
        f"confirming {len(cands)} config(s) (trials {', '.join(str(c.number) for c in cands)}) "
        f"with seeds {', '.join(map(str, seed_list))} at {spec.budget.max_epochs} epochs"
    )
    confirm = confirm_study(study, storage)
    data = load_data(spec.data)
    runs = run_confirmation(spec, cands, seed_list, confirm, data, address, log)
    rows = confirmation_table(cands, seed_list, runs, spec.objective.metric, spec.objective.mode)
    chosen = rows[0]
    if not chosen.ok:
        raise ExportError(
            f"every confirmation run failed (see study {confirm.study_name!r}: fail_reason)"
        )
    seed = median_seed(chosen)
    config = resolved_config(spec, chosen.params)
    log(
        f"chose trial {chosen.source_trial}: {spec.objective.metric} mean {chosen.mean:.4f} "
        f"± {chosen.std:.4f} over {len(chosen.ok)} seeds; final model with seed {seed}"
    )
    bundle = one_trial_spec(spec, config, seed, FINAL_SUFFIX, redact(spec.storage))
    parse_spec(bundle, "config.yaml")  # the bundle's spec must validate before it is written
    history: list[dict[str, float]] = []
    final = train_spec(parse_spec(bundle, "config.yaml"), out, log=None, history=history)
    metric = spec.objective.metric
    twin = chosen.values.get(seed)
    log(
        f"final model {metric} {final.get(metric, math.nan):.4f} (its confirmation run with "
        f"seed {seed}: {twin:.4f})"
    )
    header = (
        f"# exported from study {study_name!r}, trial {chosen.source_trial}, seed {seed}\n"
        f"# confirmed {metric} {chosen.mean:.4f} ± {chosen.std:.4f} "
        f"({len(chosen.ok)} seeds); this run: {final.get(metric, math.nan):.4f}\n"
        f"# python -m search train config.yaml reproduces it within {TOLERANCE}\n"
    )
    (out / "config.yaml").write_text(header + yaml.safe_dump(bundle, sort_keys=False))
    seconds = time.monotonic() - start
    result = ExportResult(out, rows, chosen, seed, final, seconds)
    metrics = {
        "study": study_name,
        "trainable": spec.trainable,
        "objective": {"metric": metric, "mode": spec.objective.mode},
        "confirm_study": confirm.study_name,
        "seeds": seed_list,
        "max_epochs": spec.budget.max_epochs,
        "chosen": {"source_trial": chosen.source_trial, "seed": seed, "config": config},
        "confirmation": [r.as_dict() for r in rows],
        "final": final,
        "tolerance": TOLERANCE,
        "final_seed_confirmation_value": twin,
        "final_history": history,
        "export_seconds": round(seconds, 1),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
    (out / "environment.txt").write_text(card.environment(spec.trainable))
    card.learning_curves(out / "learning_curves.png", runs, chosen.source_trial, history, metric)
    (out / "MODEL_CARD.md").write_text(card.model_card(study, spec, metrics, out))
    log(
        f"{metric} {final.get(metric, math.nan):.4f} (final model); bundle in {out}/ "
        f"({', '.join(sorted(p.name for p in out.iterdir()))}) in {seconds:.0f} s"
    )
    return result
