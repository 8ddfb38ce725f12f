"""Hand over the winner: confirm the best configs with fresh seeds, retrain, write a bundle.

``python -m search export STUDY`` does, in order:

1. to 3. **Candidates, confirmation, choice** (:mod:`search.handover.candidates`,
   :mod:`search.handover.confirm`): the top ``K`` COMPLETE trials on the primary objective
   (with several objectives: of the Pareto front), each trained again with ``S`` fresh seeds
   as Ray tasks with one trial's resources (:func:`with_placement`), recorded in the study
   ``<study>-confirm`` of ``results/<study>/confirm.db``; the candidate with the fewest
   failed runs, then the best mean, wins.
   ``--pick "latency_ms<5"`` (:mod:`search.handover.pick`) replaces the top ``K`` by the one
   trial the constraints choose.
4. **Final model** (:mod:`search.handover.train`): the chosen config is trained once more, in
   this process, through its trainable's export hook, with the seed of its
   median confirmation run, on the same training split. The validation split is kept apart
   (not merged into training): it is the only held-out data a spec has, the schedules and
   early stopping read its loss, and the exported accuracy must be reproducible by
   ``python -m search train DIR/config.yaml`` and by the ONNX model on the same split.
5. **Bundle** in ``DIR`` (:func:`write_bundle`): ``config.yaml`` (a spec: the whole config
   with every knob of the trainable, the seed, data, budget; ``run`` and ``train`` accept
   it), the model files the hook writes, ``metrics.json``, ``environment.txt``,
   ``learning_curves.png`` and ``MODEL_CARD.md`` (:mod:`search.handover.card`).

``--pareto`` (:mod:`search.handover.pareto`) confirms the whole front and writes one such
bundle per point, with the same steps.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from search.compute.cluster import init_ray
from search.compute.data import load_data
from search.compute.placement import resolve
from search.contract import declarations
from search.handover.bundle import (
    FINAL_SUFFIX,
    TOLERANCE,
    ExportResult,
    Session,
    confirmed_metrics,
    write_bundle,
)
from search.handover.candidates import (
    Candidate,
    as_candidate,
    candidates,
    confirmation_seeds,
    resolved_config,
)
from search.handover.confirm import (
    ConfirmRun,
    Row,
    confirm_study,
    confirmation_table,
    run_confirmation,
)
from search.handover.pick import parse_constraints, pick_trial
from search.handover.register import export_folder
from search.handover.train import ExportError, Log, check_returns_model, no_hook, will_import
from search.record.study import load_study, stored_spec
from search.report.artifacts import attach_file
from search.specs.schema import parse_spec

if TYPE_CHECKING:
    from collections.abc import Sequence

    import optuna

    from search.specs.schema import StudySpec

__all__ = [
    "FINAL_SUFFIX",
    "TOLERANCE",
    "ExportResult",
    "confirm_candidates",
    "export_study",
    "open_session",
    "with_placement",
]


def with_placement(spec: StudySpec) -> StudySpec:
    """``spec`` with its ``resources`` resolved on this Ray cluster into plain numbers.

    ``cpus_per_trial`` unset or ``gpus_per_trial: auto`` become what a trial got (see
    :mod:`search.compute.placement`), so the confirmation runs, the final run and ``config.yaml``
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


def open_session(
    study: optuna.Study,
    spec: StudySpec,
    results_dir: Path,
    seeds: int,
    address: str | None,
    log: Log,
    start: float,
    first: Candidate,
) -> Session:
    """Refuses a trainable without an export hook, loads the data and refuses a trainable
    that returns no model its hook could save (tried on ``first``'s config), then starts Ray.
    """
    if declarations(spec.trainable).export is None:
        raise ExportError(no_hook(spec.trainable))
    data = load_data(spec.data)
    check_returns_model(spec, resolved_config(spec, first.params), data)
    init_ray(address)
    spec = with_placement(spec)
    confirm = confirm_study(study, results_dir)
    seed_list = confirmation_seeds(spec, seeds)
    return Session(study, spec, seed_list, confirm, data, address, log, start)


def confirm_candidates(
    session: Session, cands: Sequence[Candidate]
) -> tuple[list[ConfirmRun], list[Row]]:
    """Every candidate trained with every seed; the table on the primary objective, best
    first."""
    spec = session.spec
    session.log(
        f"confirming {len(cands)} config(s) (trials {', '.join(str(c.number) for c in cands)}) "
        f"with seeds {', '.join(map(str, session.seeds))} at {spec.budget.max_epochs} epochs"
    )
    runs = run_confirmation(
        spec, cands, session.seeds, session.confirm, session.data, session.address, session.log
    )
    rows = confirmation_table(cands, session.seeds, runs, spec.primary.metric, spec.primary.mode)
    return runs, rows


def export_study(
    study_name: str,
    storage: str,
    out_dir: Path | None = None,
    top_k: int = 3,
    seeds: int = 3,
    address: str | None = None,
    results_dir: Path = Path("results"),
    log: Log = print,
    pick: str | None = None,
) -> ExportResult:
    """The whole ``export`` command (module docstring); returns what it wrote and measured.

    Args:
        pick: Constraints (``"latency_ms<5"``, :mod:`search.handover.pick`): export the one
            trial they choose instead of the top ``top_k``.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.monotonic()
    study = load_study(study_name, storage)
    spec = stored_spec(study, storage, find_code=True, required=True)
    out = Path(out_dir) if out_dir else export_folder(results_dir, study.study_name)
    log(will_import(spec, f"the spec stored in study {study_name!r}"))
    cands = _choose(study, spec, top_k, pick, log)
    session = open_session(study, spec, results_dir, seeds, address, log, start, cands[0])
    out.mkdir(parents=True, exist_ok=True)
    runs, rows = confirm_candidates(session, cands)
    if not rows[0].ok:
        raise ExportError(
            f"every confirmation run failed (see study {session.confirm.study_name!r}: fail_reason)"
        )
    result = write_bundle(session, rows[0], rows, runs, out)
    if pick:
        _check_pick(session, rows[0], runs, pick)
    # The winner's card, beside its trial in optuna-dashboard's artifact tab.
    winner = study.trials[rows[0].source_trial]
    attach_file(study, out / "MODEL_CARD.md", winner, results_dir)
    return result


def _choose(
    study: optuna.Study, spec: StudySpec, top_k: int, pick: str | None, log: Log
) -> list[Candidate]:
    """The candidates: the one trial ``pick`` chooses, or the top ``top_k`` (the front's, and
    a line that says so, with several objectives)."""
    names = [o.metric for o in spec.objectives]
    if pick:
        trial, _, fits = pick_trial(study, spec, pick)
        values = ", ".join(f"{n}={v:.4g}" for n, v in zip(names, trial.values, strict=False))
        log(
            f"--pick {pick!r}: trial {trial.number} ({values}), the best on "
            f"{spec.primary.metric} of {fits} trial(s) that satisfy it"
        )
        return [as_candidate(trial)]
    if spec.multi_objective:
        log(
            f"study {study.study_name!r} has {len(names)} objectives ({', '.join(names)}): "
            f"exporting the Pareto front's best on {spec.primary.metric}; --pareto exports "
            f"every point of the front, --pick '{names[1]}<...' chooses one by a constraint"
        )
    return candidates(study, top_k)


def _check_pick(session: Session, chosen: Row, runs: Sequence[ConfirmRun], pick: str) -> None:
    """A note for each constraint the confirmed mean no longer satisfies (the search value
    did; fresh seeds may disagree)."""
    constraints = parse_constraints(pick)
    stats = confirmed_metrics(chosen, runs, [c.metric for c in constraints])
    for c in constraints:
        mean = stats[c.metric]["mean"]
        if not c.holds(mean):
            session.log(
                f"note: trial {chosen.source_trial} satisfied {c} in the search, but its "
                f"confirmed mean {c.metric} is {'missing' if mean is None else f'{mean:.4g}'}"
            )
