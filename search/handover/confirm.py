"""Confirm the best configs of a study with fresh seeds (steps 1 to 3 of ``export``).

1. **Candidates** (:mod:`search.handover.candidates`): the top ``K`` COMPLETE trials of the
   study on the primary objective (the Pareto front's, with several objectives).
2. **Confirmation**: each candidate is trained again ``S`` times at the full epoch budget, with
   fresh seeds (:func:`~search.handover.candidates.confirmation_seeds`: the same ``S`` seeds
   for every candidate, none of them a seed the search used), as plain ``ray.remote`` tasks
   with one trial's resources and a trial's threads and GPU memory cap
   (:func:`search.compute.limits.prepare`, user attribute ``limits`` as on a trial), at most
   ``resources.max_concurrent`` at once, and the retries of a trial: a run that raised (but
   not one of :data:`search.contract.driver.NOT_RETRIED`, which fail the same way every time) or
   whose process died starts again, up to ``faults.max_failures`` times, each retry said in
   one line and kept in the user attributes ``retries`` and ``retried_after`` (search trials
   already had their chance to be lucky; new seeds measure the config, not the draw). Every
   run is recorded in the study ``<study>-confirm`` of ``results/<study>/confirm.db``, with its
   intermediate values and the user attributes ``role: confirmation``, ``source_trial``,
   ``seed``, ``export_run``; the search study itself is left alone, so its sampler and
   ``best_trial`` see search trials only. The confirmation study has one objective, the
   primary one (each run's value); every metric of a run's last epoch is in its user
   attribute ``final_metrics``. When fewer runs than asked end with a value, one line says
   so (:func:`shortfall`), and so does the model card.
3. **Choice** (:func:`confirmation_table`): the candidate with the fewest failed runs, then
   the best mean (spread: sample standard deviation, min and max).

:mod:`search.handover.export` then trains the final model and writes the bundle.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.compute.cluster import init_ray
from search.contract import HANDED, receive
from search.contract.driver import NOT_RETRIED
from search.errors import one_line
from search.handover.candidates import Candidate, resolved_config
from search.handover.train import Log, train_once
from search.record.queries import confirmed_order
from search.record.storage import open_storage, redacted_spec
from search.record.study import CONFIRM_SUFFIX, confirm_storage
from search.specs.schema import parse_spec

if TYPE_CHECKING:
    import optuna

    from search.contract.dataset import Dataset
    from search.specs.schema import StudySpec

ROLE = "confirmation"
"""User attribute ``role`` of every confirmation trial (and of the confirmation study)."""


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
    limits: dict[str, Any] = field(default_factory=dict)
    """What the run's process got (:func:`search.compute.limits.apply_limits`), as a trial's
    user attribute ``limits``."""
    retriable: bool = False
    """Whether it failed by an error that a retry may not meet again (it raised, but not one
    of :data:`~search.contract.driver.NOT_RETRIED`; or its process died)."""
    retries: int = 0
    retried_after: list[str] = field(default_factory=list)
    """The error of each attempt that was retried, one line each."""

    def value(self, metric: str) -> float | None:
        """The metric of the last epoch, or ``None`` when the run failed or lacks it."""
        if self.fail_reason or not self.history or metric not in self.history[-1]:
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


# --- confirmation runs (Ray tasks) ------------------------------------------------------------


def _confirm_task(
    spec_data: dict[str, Any],
    params: dict[str, Any],
    seed: int,
    number: int,
    data: Dataset,
    handed: dict[str, Any],
) -> ConfirmRun:
    """Runs in a Ray worker: one candidate, one seed, every epoch of the budget; ``handed``:
    the driver's functions handed over from Python (a notebook's trainable)."""
    import socket

    import ray

    receive(handed)
    spec = parse_spec(spec_data)
    gpu_ids = ray.get_gpu_ids()
    run = ConfirmRun(
        number,
        seed,
        device=f"cuda ({','.join(map(str, gpu_ids))})" if gpu_ids else "cpu",
        node=socket.gethostname(),
    )
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="search-confirm-") as folder:
        try:
            run.history, run.fail_reason, run.limits = train_once(
                spec,
                params,
                data,
                seed=seed,
                folder=folder,
                number=number,
                device="cuda" if gpu_ids else "cpu",
            )
        except Exception as exc:  # the run fails, the export goes on with the others
            run.fail_reason = one_line(f"{type(exc).__name__}: {exc}", limit=500)
            run.retriable = not isinstance(exc, NOT_RETRIED)
    run.seconds = time.monotonic() - start
    return run


def record_run(
    confirm: optuna.Study, run: ConfirmRun, candidate: Candidate, metric: str, export_run: str
) -> None:
    """Adds ``run`` to the confirmation study: COMPLETE (last epoch's metric) or FAIL."""
    import optuna
    from optuna.trial import TrialState

    curve = {
        epoch: row[metric]
        for epoch, row in enumerate(run.history, start=1)
        if math.isfinite(row.get(metric, math.nan))
    }
    value = run.value(metric)
    attrs: dict[str, Any] = {
        "role": ROLE,
        "source_trial": candidate.number,
        "seed": run.seed,
        "export_run": export_run,
        "epochs": len(run.history),
        "seconds": round(run.seconds, 3),
        "device": run.device,
        "node": run.node,
        "retries": run.retries,
    }
    if run.retried_after:
        attrs["retried_after"] = run.retried_after
    if run.limits:
        attrs["limits"] = run.limits
    if run.fail_reason:
        attrs["fail_reason"] = run.fail_reason
    if run.history:
        attrs["final_metrics"] = {k: v for k, v in run.history[-1].items() if math.isfinite(v)}
    confirm.add_trial(
        optuna.trial.create_trial(
            state=TrialState.COMPLETE if value is not None else TrialState.FAIL,
            value=value,
            params=candidate.params,
            distributions=candidate.distributions,
            user_attrs=attrs,
            intermediate_values=curve,
        )
    )


def confirm_study(study: optuna.Study, results_dir: Path) -> optuna.Study:
    """The study ``<study>-confirm`` in ``<results_dir>/<study>/confirm.db``, created when
    missing: a storage apart from the search's, so that optuna-dashboard on the search's
    storage lists the user's studies only (:data:`search.record.study.CONFIRM_FILE`)."""
    import optuna

    confirm = optuna.create_study(
        study_name=study.study_name + CONFIRM_SUFFIX,
        storage=open_storage(confirm_storage(results_dir, study.study_name)),
        direction=study.directions[0],  # the primary objective; every metric is in final_metrics
        load_if_exists=True,
    )
    confirm.set_user_attr("role", ROLE)
    confirm.set_user_attr("source_study", study.study_name)
    return confirm


def run_confirmation(
    spec: StudySpec,
    cands: Sequence[Candidate],
    seeds: Sequence[int],
    confirm: optuna.Study,
    data: Dataset,
    address: str | None,
    log: Log,
) -> list[ConfirmRun]:
    """Trains every candidate with every seed as Ray tasks; records each run as it ends."""
    import ray

    init_ray(address)
    task = ray.remote(_confirm_task).options(
        num_cpus=spec.resources.cpus_per_trial or 1.0,
        num_gpus=float(spec.resources.gpus_per_trial or 0.0),
        max_retries=0,  # retried below, as a trial is, and counted
        name="search-confirm",
    )
    data_ref = ray.put(data)
    handed = ray.put(dict(HANDED))
    spec_data = redacted_spec(spec.to_dict())  # tasks never need the URLs' passwords
    export_run = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    by_number = {c.number: c for c in cands}
    queue = [(c, seed) for c in cands for seed in seeds]
    total, limit = len(queue), spec.resources.max_concurrent or len(queue)
    pending: dict[Any, tuple[int, int]] = {}
    earlier: dict[tuple[int, int], list[str]] = {}  # (trial, seed) -> errors of its retries
    runs: list[ConfirmRun] = []
    metric = spec.primary.metric
    while queue or pending:
        while queue and len(pending) < limit:  # resources.max_concurrent holds here too
            c, seed = queue.pop(0)
            config = resolved_config(spec, c.params)
            ref = task.remote(spec_data, config, seed, c.number, data_ref, handed)
            pending[ref] = (c.number, seed)
        ready, _ = ray.wait(list(pending), num_returns=1)
        number, seed = pending.pop(ready[0])
        run = _result(ready[0], number, seed)
        if _retried(run, earlier.setdefault((number, seed), []), spec.faults.max_failures, log):
            queue.insert(0, (by_number[number], seed))  # it starts again before the others
            continue
        record_run(confirm, run, by_number[number], metric, export_run)
        runs.append(run)
        retried = f" after {run.retries} retr{'y' if run.retries == 1 else 'ies'}"
        log(
            f"confirm {len(runs):>2}/{total}: trial {number:>3} seed {seed} "
            f"epochs {len(run.history):>3} {_shown(run, spec)} ({run.seconds:.1f} s)"
            + (retried if run.retries else "")
        )
    if (short := shortfall(runs, total, metric, confirm.study_name)) is not None:
        log(short)
    return runs


def _retried(run: ConfirmRun, earlier: list[str], max_failures: int, log: Log) -> bool:
    """Whether ``run`` starts again, as a trial would (``faults.max_failures``): said in one
    line, its error added to ``earlier`` (the errors of its attempts so far, which the run
    keeps as ``retried_after``)."""
    run.retried_after, run.retries = earlier, len(earlier)
    if not (run.retriable and run.fail_reason and run.retries < max_failures):
        return False
    earlier.append(run.fail_reason)
    log(
        f"confirm: trial {run.source_trial} seed {run.seed} failed ({run.fail_reason}); "
        f"retry {run.retries + 1} of {max_failures} (faults.max_failures)"
    )
    return True


def _result(ref: Any, number: int, seed: int) -> ConfirmRun:
    """The run a finished task returned, or a failed run when its process died (out of
    memory, killed) or its setup failed: retriable, as a trial whose process died."""
    import ray

    try:
        run: ConfirmRun = ray.get(ref)
    except Exception as exc:
        cause = getattr(exc, "cause", None) or exc
        reason = f"{type(cause).__name__}: {one_line(str(cause), limit=300, where='last')}"
        return ConfirmRun(number, seed, fail_reason=reason, retriable=True)
    return run


def shortfall(runs: Sequence[ConfirmRun], asked: int, metric: str, study: str) -> str | None:
    """One line when fewer than ``asked`` runs ended with a value of ``metric``: how many,
    and the first failure's reason; ``None`` when every run asked for did.

    Example:
        >>> ok = ConfirmRun(0, 1, history=[{"acc": 0.9}])
        >>> bad = ConfirmRun(0, 2, fail_reason="RecursionError: too deep", retries=2)
        >>> shortfall([ok, bad], 2, "acc", "s-confirm")  # doctest: +NORMALIZE_WHITESPACE
        "confirmed 1 of 2 runs asked for: 1 failed (trial 0 seed 2:
        RecursionError: too deep); each run's fail_reason is in study 's-confirm'"
    """
    failed = sorted((r for r in runs if r.value(metric) is None), key=_order)
    done = len(runs) - len(failed)
    if done >= asked:
        return None
    why = ", ".join(
        f"trial {r.source_trial} seed {r.seed}: {r.fail_reason or f'no {metric}'}"
        for r in failed[:1]
    )
    return (
        f"confirmed {done} of {asked} runs asked for: {len(failed)} failed"
        f"{f' ({why})' if why else ''}; each run's fail_reason is in study {study!r}"
    )


def _order(run: ConfirmRun) -> tuple[int, int]:
    return run.source_trial, run.seed


def _shown(run: ConfirmRun, spec: StudySpec) -> str:
    """``val_accuracy=0.9123 latency_ms=4.0000`` (every objective), or ``FAIL <reason>``."""
    if run.value(spec.primary.metric) is None:
        return f"FAIL {run.fail_reason}"
    values = {o.metric: run.value(o.metric) for o in spec.objectives}
    return " ".join(f"{k}={v:.4f}" if v is not None else f"{k}=missing" for k, v in values.items())


def confirmation_table(
    cands: Sequence[Candidate],
    seeds: Sequence[int],
    runs: Sequence[ConfirmRun],
    metric: str,
    mode: str,
) -> list[Row]:
    """One row per candidate, best first: fewest failed runs, then the best mean."""
    rows = []
    for c in cands:
        values = {r.seed: r.value(metric) for r in runs if r.source_trial == c.number}
        rows.append(Row(c.number, c.value, {s: values.get(s) for s in seeds}, c.params))
    return sorted(
        rows,
        key=lambda r: confirmed_order(r.failed, r.mean if r.ok else None, r.source_trial, mode),
    )


def median_seed(row: Row) -> int:
    """The seed of the row's median run (the lower median for an even count)."""
    ok = sorted((v, s) for s, v in row.values.items() if v is not None)
    return ok[(len(ok) - 1) // 2][1]
