"""``export --pareto``: confirm every point of a multi-objective study's Pareto front, write
one bundle per point and an index of the front.

A study with several objectives (accuracy up, latency down) ends with a front of trade-offs,
not one winner; which trade-off to ship is the user's call, made on confirmed numbers:

1. **Candidates**: every COMPLETE trial on the search's Pareto front
   (:func:`search.record.queries.pareto_trials`), duplicates of the same parameters dropped.
2. **Confirmation**: the same runs as a plain export (``S`` fresh seeds each, Ray tasks,
   recorded in ``<study>-confirm`` of ``results/<study>/confirm.db``), all points at once.
3. **Bundles**: each point whose confirmation did not fail entirely is trained once more and
   written as the plain export writes its bundle (:func:`search.handover.bundle.write_bundle`),
   in ``trial-<N>/`` (``N``: the search trial); its ``config.yaml`` names the study
   ``<study>-pareto-<N>``. ``metrics.json`` gains ``pareto`` (every objective's confirmed
   mean and spread) and ``MODEL_CARD.md`` a section on the point.
4. **Index** (:mod:`search.handover.pareto_index`): ``pareto.csv``, ``PARETO.md`` and
   ``pareto.png`` beside the bundles.

The folder is ``--out`` or ``results/<study>/export/pareto/``. A single-objective study has
no front to export: ``--pareto`` is refused in one line.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.handover.bundle import confirmed_metrics, write_bundle
from search.handover.candidates import candidates
from search.handover.confirm import ConfirmRun, Row
from search.handover.export import confirm_candidates, open_session
from search.handover.pareto_index import ParetoPoint, write_index
from search.handover.register import export_folder
from search.handover.train import ExportError, Log, will_import
from search.record.study import load_study, stored_spec
from search.report.artifacts import attach_file

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from search.handover.bundle import Session


@dataclass(frozen=True)
class ParetoResult:
    """What ``export --pareto`` wrote and measured."""

    out_dir: Path
    points: list[ParetoPoint]
    files: list[Path]  # the index
    seconds: float


def export_pareto(
    study_name: str,
    storage: str,
    out_dir: Path | None = None,
    seeds: int = 3,
    address: str | None = None,
    results_dir: Path = Path("results"),
    log: Log = print,
) -> ParetoResult:
    """The ``export --pareto`` command (module docstring).

    Raises:
        ExportError: When the study has one objective, no COMPLETE trial, a trainable without
            an export hook, or every confirmation run failed.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.monotonic()
    study = load_study(study_name, storage)
    spec = stored_spec(study, storage, find_code=True, required=True)
    log(will_import(spec, f"the spec stored in study {study_name!r}"))
    if not spec.multi_objective:
        raise ExportError(
            f"--pareto: study {study_name!r} has one objective ({spec.primary.metric}), so no "
            "Pareto front; export it without --pareto (or choose by constraints with --pick)"
        )
    cands = candidates(study, top_k=sys.maxsize)  # the whole front
    out = Path(out_dir) if out_dir else export_folder(results_dir, study_name, pareto=True)
    session = open_session(study, spec, results_dir, seeds, address, log, start, cands[0])
    log(f"Pareto front of {study_name!r}: {len(cands)} point(s)")
    out.mkdir(parents=True, exist_ok=True)
    runs, rows = confirm_candidates(session, cands)
    if not any(row.ok for row in rows):
        raise ExportError(
            f"every confirmation run failed (see study {session.confirm.study_name!r}: fail_reason)"
        )
    values = {t.number: t.values for t in study.get_trials(deepcopy=False)}
    names = [o.metric for o in spec.objectives]
    searched = {n: dict(zip(names, v, strict=True)) for n, v in values.items() if v}
    points = [_export_point(session, row, runs, out, searched[row.source_trial]) for row in rows]
    files = write_index(out, session, points)
    for point in points:  # each point's card beside its trial in optuna-dashboard
        if point.bundle is not None:
            trial = study.trials[point.row.source_trial]
            attach_file(study, point.bundle.out_dir / "MODEL_CARD.md", trial, results_dir)
    seconds = time.monotonic() - start
    done = sum(p.bundle is not None for p in points)
    log(
        f"{done} bundle(s) and the index ({', '.join(p.name for p in files)}) in {out}/ "
        f"in {seconds:.0f} s"
    )
    return ParetoResult(out, points, files, seconds)


def _export_point(
    session: Session,
    row: Row,
    runs: Sequence[ConfirmRun],
    out: Path,
    search: Mapping[str, float],
) -> ParetoPoint:
    """One point's bundle in ``out/trial-<N>/`` (none when every run of it failed)."""
    names = [o.metric for o in session.spec.objectives]
    confirmed = confirmed_metrics(row, runs, names)
    if not row.ok:
        session.log(f"trial {row.source_trial}: every confirmation run failed; no bundle")
        return ParetoPoint(row, confirmed, dict(search), None)
    extra = {"pareto": {"index": "../PARETO.md", "search": dict(search), "confirmed": confirmed}}
    bundle = write_bundle(
        session,
        row,
        [row],
        [r for r in runs if r.source_trial == row.source_trial],
        out / f"trial-{row.source_trial}",
        suffix=f"-pareto-{row.source_trial}",
        extra=extra,
        card_note=_card_note(session, row, search, confirmed),
        label="Pareto point:",
    )
    return ParetoPoint(row, confirmed, dict(search), bundle)


def _card_note(
    session: Session,
    row: Row,
    search: Mapping[str, float],
    confirmed: Mapping[str, Mapping[str, Any]],
) -> str:
    """The ``MODEL_CARD.md`` section that says which trade-off this bundle is."""
    lines = [
        "## A point of the Pareto front",
        "",
        f"This bundle is search trial {row.source_trial}, one point of the Pareto front of "
        f"study `{session.study.study_name}` (`export --pareto`); it was not chosen over the "
        "others. The whole front, confirmed: [PARETO.md](../PARETO.md).",
        "",
        "| objective | mode | search | confirmed mean | std | failed runs |",
        "|---|---|---|---|---|---|",
    ]
    for o in session.spec.objectives:
        stats = confirmed[o.metric]
        lines.append(
            f"| {o.metric} | {o.mode} | {_f(search.get(o.metric))} | {_f(stats['mean'])} | "
            f"{_f(stats['std'])} | {stats['failed']} |"
        )
    return "\n".join(lines) + "\n"


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"
