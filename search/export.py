"""Hand over the winner: confirm the best configs with fresh seeds, retrain, write a bundle.

``python -m search export STUDY`` does, in order:

1. **Candidates**: the top ``K`` COMPLETE trials of the study (best value first, duplicates of
   the same parameters dropped). A study without a COMPLETE trial is refused (one line).
2. **Confirmation**: each candidate is trained again ``S`` times at the full epoch budget, with
   fresh seeds (:func:`confirmation_seeds`: the same ``S`` seeds for every candidate, none of
   them a seed the search used), as plain ``ray.remote`` tasks with one trial's resources
   (:func:`with_placement`), at most ``resources.max_concurrent`` at once (search trials
   already had their chance to be lucky; new seeds measure the config, not the draw).
   Every run is recorded in the study ``<study>-confirm`` of the same storage,
   with its intermediate values and the user attributes ``role: confirmation``,
   ``source_trial``, ``seed``, ``export_run``; the search study itself is left alone, so
   its sampler and ``best_trial`` see search trials only.
3. **Choice**: the candidate with the fewest failed runs, then the best mean (spread: sample
   standard deviation, min and max).
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
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from search.errors import SearchError, one_line
from search.storage import redact

if TYPE_CHECKING:
    import optuna

    from search.data import Dataset
    from search.spec import StudySpec

CONFIRM_SUFFIX = "-confirm"
"""The confirmation runs of study ``X`` are the trials of study ``X-confirm``."""

ROLE = "confirmation"
"""User attribute ``role`` of every confirmation trial (and of the confirmation study)."""

CONFIRM_SEED_OFFSET = 1_000_000
"""Confirmation seeds start here above the sampler's seed; search trial ``n`` used seed + n."""

TOLERANCE = 0.02
"""How close ``python -m search train config.yaml`` must come to the exported metric."""

FINAL_SUFFIX = "-final"


class ExportError(SearchError):
    """The study cannot be exported (no COMPLETE trial, no export hook, every run failed)."""


Log = Callable[[str], None]


@dataclass(frozen=True)
class Candidate:
    """One COMPLETE search trial that goes to confirmation."""

    number: int
    value: float
    params: dict[str, Any]
    distributions: dict[str, Any]


@dataclass
class ConfirmRun:
    """One confirmation run: a candidate trained with one seed to the full budget."""

    source_trial: int
    seed: int
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    fail_reason: str | None = None
    device: str = "cpu"
    node: str = ""

    def value(self, metric: str) -> float | None:
        """The metric of the last epoch, or ``None`` when the run failed."""
        if self.fail_reason or not self.history:
            return None
        return float(self.history[-1][metric])


@dataclass(frozen=True)
class Row:
    """A candidate's line of the confirmation table."""

    source_trial: int
    search_value: float
    values: dict[int, float | None]  # seed -> final metric (None: failed)
    params: dict[str, Any]

    @property
    def ok(self) -> list[float]:
        return [v for v in self.values.values() if v is not None]

    @property
    def failed(self) -> int:
        return sum(v is None for v in self.values.values())

    @property
    def mean(self) -> float:
        return statistics.fmean(self.ok) if self.ok else math.nan

    @property
    def std(self) -> float:
        return statistics.stdev(self.ok) if len(self.ok) > 1 else 0.0

    def as_dict(self) -> dict[str, Any]:
        ok = self.ok
        return {
            "source_trial": self.source_trial,
            "search_value": self.search_value,
            "mean": self.mean if ok else None,
            "std": self.std if ok else None,
            "min": min(ok) if ok else None,
            "max": max(ok) if ok else None,
            "runs": len(self.values),
            "failed": self.failed,
            "values": {str(seed): v for seed, v in self.values.items()},
            "params": self.params,
        }


# --- candidates and seeds ----------------------------------------------------------------------


def stored_spec(study: optuna.Study, storage: str) -> StudySpec:
    """The spec recorded on ``study``, with ``storage`` (the real URL) for the redacted one.

    Raises:
        ExportError: When the study holds no spec (it was not created by ``search run``).
    """
    from search.spec import parse_spec

    data = study.user_attrs.get("spec")
    if not isinstance(data, dict):
        raise ExportError(f"study {study.study_name!r} has no spec (user attribute 'spec'); "
                          "only studies made by 'python -m search run' can be exported")
    return parse_spec({**data, "storage": storage}, f"study {study.study_name!r}: spec")


def candidates(study: optuna.Study, top_k: int) -> list[Candidate]:
    """The ``top_k`` best COMPLETE trials with finite values, distinct parameters.

    Raises:
        ExportError: When the study has no COMPLETE trial.
    """
    from optuna.study import StudyDirection
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None
            and math.isfinite(t.value)]
    if not done:
        counts = {s: sum(t.state.name == s for t in trials) for s in ("PRUNED", "FAIL")}
        raise ExportError(
            f"study {study.study_name!r} has no COMPLETE trial to export ({len(trials)} trials: "
            f"{counts['PRUNED']} pruned, {counts['FAIL']} failed); run more trials first")
    sign = -1.0 if study.direction == StudyDirection.MAXIMIZE else 1.0
    done.sort(key=lambda t: (sign * float(t.value or 0.0), t.number))
    chosen: list[Candidate] = []
    seen: set[str] = set()
    for trial in done:
        key = json.dumps(trial.params, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        chosen.append(Candidate(trial.number, float(trial.value or 0.0), dict(trial.params),
                                dict(trial.distributions)))
        if len(chosen) == top_k:
            break
    return chosen


def confirmation_seeds(spec: StudySpec, count: int) -> list[int]:
    """``count`` seeds no search trial used (trial ``n`` trains with ``sampler.seed + n``)."""
    base = (spec.sampler.seed or 0) + CONFIRM_SEED_OFFSET
    return [base + j for j in range(count)]


def resolved_config(spec: StudySpec, params: Mapping[str, Any]) -> dict[str, Any]:
    """``fixed`` and ``params``, plus every other knob the trainable reads at its default.

    The defaults come from the trainable module's ``DEFAULTS`` dict when it has one, so the
    exported config does not depend on defaults that a later version might change.
    """
    import importlib

    from search.trainable import BUILTIN

    module_name = BUILTIN.get(spec.trainable, spec.trainable).partition(":")[0]
    defaults = getattr(importlib.import_module(module_name), "DEFAULTS", None)
    plain = (str, int, float, bool, type(None))
    known = {k: v for k, v in (defaults or {}).items() if isinstance(v, plain)}
    return {**known, **spec.fixed, **params}


def trial_context(spec: StudySpec, data: Dataset, seed: int, number: int, device: str,
                  folder: str, **extras: Any) -> Any:
    """The :class:`TrialContext` a trial of ``spec`` gets, outside Ray Tune, profiling off."""
    from search.runner import trial_extras
    from search.trainable import TrialContext

    return TrialContext(
        max_epochs=spec.budget.max_epochs, seed=seed,
        num_threads=max(1, int(spec.resources.cpus_per_trial or 1)), device=device,
        trial_number=number, trial_dir=folder,
        extras={**trial_extras(spec, data), "profile": False, **extras},
    )


# --- confirmation runs (Ray tasks) ------------------------------------------------------------


def _confirm_task(spec_data: dict[str, Any], params: dict[str, Any], seed: int, number: int,
                  data: Dataset) -> ConfirmRun:
    """Runs in a Ray worker: one candidate, one seed, every epoch of the budget."""
    import socket

    import ray

    from search.record import nonfinite_reason
    from search.spec import parse_spec
    from search.trainable import resolve_trainable

    spec = parse_spec(spec_data)
    gpu_ids = ray.get_gpu_ids()
    run = ConfirmRun(number, seed, device=f"cuda ({','.join(map(str, gpu_ids))})" if gpu_ids
                     else "cpu", node=socket.gethostname())
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, int(spec.resources.cpus_per_trial or 1))))
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="search-confirm-") as folder:
        ctx = trial_context(spec, data, seed, number, "cuda" if gpu_ids else "cpu", folder)
        epochs = None
        try:
            epochs = resolve_trainable(spec.trainable)(params, data, ctx)
            for epoch, metrics in enumerate(epochs, start=1):
                run.history.append({k: float(v) for k, v in metrics.items()})
                reason = nonfinite_reason(metrics, epoch)
                if reason or epoch >= spec.budget.max_epochs:
                    run.fail_reason = reason
                    break
            else:
                if not run.history:
                    run.fail_reason = "the trainable yielded no epoch"
        except Exception as exc:  # the run fails, the export goes on with the others
            run.fail_reason = f"{type(exc).__name__}: {one_line(str(exc))}"[:500]
        finally:
            if epochs is not None and hasattr(epochs, "close"):
                epochs.close()
    run.seconds = time.monotonic() - start
    return run


def record_run(confirm: optuna.Study, run: ConfirmRun, candidate: Candidate, metric: str,
               export_run: str) -> None:
    """Adds ``run`` to the confirmation study: COMPLETE (last epoch's metric) or FAIL."""
    import optuna
    from optuna.trial import TrialState

    curve = {epoch: row[metric] for epoch, row in enumerate(run.history, start=1)
             if math.isfinite(row.get(metric, math.nan))}
    value = run.value(metric)
    attrs: dict[str, Any] = {
        "role": ROLE, "source_trial": candidate.number, "seed": run.seed,
        "export_run": export_run, "epochs": len(run.history), "seconds": round(run.seconds, 3),
        "device": run.device, "node": run.node,
    }
    if run.fail_reason:
        attrs["fail_reason"] = run.fail_reason
    if run.history:
        attrs["final_metrics"] = {k: v for k, v in run.history[-1].items() if math.isfinite(v)}
    confirm.add_trial(optuna.trial.create_trial(
        state=TrialState.COMPLETE if value is not None else TrialState.FAIL,
        value=value, params=candidate.params, distributions=candidate.distributions,
        user_attrs=attrs, intermediate_values=curve,
    ))


def confirm_study(study: optuna.Study, storage: str) -> optuna.Study:
    """The study ``<study>-confirm`` in the same storage, created when missing."""
    import optuna

    from search.storage import open_storage

    confirm = optuna.create_study(
        study_name=study.study_name + CONFIRM_SUFFIX, storage=open_storage(storage),
        direction=study.direction, load_if_exists=True,
    )
    confirm.set_user_attr("role", ROLE)
    confirm.set_user_attr("source_study", study.study_name)
    return confirm


def run_confirmation(spec: StudySpec, cands: Sequence[Candidate], seeds: Sequence[int],
                     confirm: optuna.Study, data: Dataset, address: str | None,
                     log: Log) -> list[ConfirmRun]:
    """Trains every candidate with every seed as Ray tasks; records each run as it ends."""
    import ray

    from search.runner import init_ray

    init_ray(address)
    task = ray.remote(_confirm_task).options(
        num_cpus=spec.resources.cpus_per_trial or 1.0,
        num_gpus=float(spec.resources.gpus_per_trial or 0.0),
        max_retries=spec.faults.max_failures, name="search-confirm",
    )
    data_ref = ray.put(data)
    spec_data = spec.to_dict() | {"storage": redact(spec.storage)}  # tasks never need it
    export_run = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    by_number = {c.number: c for c in cands}
    queue = [(c, seed) for c in cands for seed in seeds]
    total, limit = len(queue), spec.resources.max_concurrent or len(queue)
    pending: dict[Any, tuple[int, int]] = {}
    runs: list[ConfirmRun] = []
    metric = spec.objective.metric
    while queue or pending:
        while queue and len(pending) < limit:  # resources.max_concurrent holds here too
            c, seed = queue.pop(0)
            config = resolved_config(spec, c.params)
            pending[task.remote(spec_data, config, seed, c.number, data_ref)] = (c.number, seed)
        ready, _ = ray.wait(list(pending), num_returns=1)
        number, seed = pending.pop(ready[0])
        try:
            run = ray.get(ready[0])
        except Exception as exc:  # the worker died (out of memory, killed) or setup failed
            cause = getattr(exc, "cause", None) or exc
            last = (str(cause).strip().splitlines() or [""])[-1]
            run = ConfirmRun(number, seed,
                             fail_reason=f"{type(cause).__name__}: {one_line(last)[:300]}")
        record_run(confirm, run, by_number[number], metric, export_run)
        runs.append(run)
        value = run.value(metric)
        shown = f"{metric}={value:.4f}" if value is not None else f"FAIL {run.fail_reason}"
        log(f"confirm {len(runs):>2}/{total}: trial {number:>3} seed {seed} "
            f"epochs {len(run.history):>3} {shown} ({run.seconds:.1f} s)")
    return runs


def confirmation_table(cands: Sequence[Candidate], seeds: Sequence[int],
                       runs: Sequence[ConfirmRun], metric: str, mode: str) -> list[Row]:
    """One row per candidate, best first: fewest failed runs, then the best mean."""
    rows = []
    for c in cands:
        values = {r.seed: r.value(metric) for r in runs if r.source_trial == c.number}
        rows.append(Row(c.number, c.value, {s: values.get(s) for s in seeds}, c.params))
    sign = -1.0 if mode == "max" else 1.0
    return sorted(rows, key=lambda r: (r.failed, sign * r.mean if r.ok else math.inf,
                                       r.source_trial))


def median_seed(row: Row) -> int:
    """The seed of the row's median run (the lower median for an even count)."""
    ok = sorted((v, s) for s, v in row.values.items() if v is not None)
    return ok[(len(ok) - 1) // 2][1]


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
