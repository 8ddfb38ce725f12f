"""``search.run``: a search from Python, a notebook's cell or a script, to the same spec and
the same record as ``python -m search run``.

The spec is a YAML file's path, YAML text or a ``dict``, checked by the same schema with the
same one-line errors (raised as :class:`~search.errors.SpecError`, never ``SystemExit``); the
keyword arguments override what the command's options override. ``trainable=`` takes the
function itself, defined in a cell or a script's ``__main__`` too: the spec names it
``module:function`` (:func:`search.contract.registry.hand_over`) and every trial receives
it with its job, pickled by value by Ray where its module cannot be imported. ``data=``
takes an object, or a function that loads it (called once, in this process).

Ray starts at the first ``run`` of a process and stays up for the next one (the commands
start one per run); it stops with the process (Ray's own exit hook; a kernel killed outright
leaves none either: :mod:`search.compute.cluster`). Ctrl-C, or a notebook kernel's
interrupt, stops the run as it stops the command: the running trials are cut and recorded,
the summary is printed, then ``KeyboardInterrupt`` is raised; the same call continues the
study.

Example:
    >>> import search
    >>> search.run({"study": "x", "trainable": "search.testing:curve"})
    Traceback (most recent call last):
    ...
    search.errors.SpecError: search.run: objective: Field required
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from search.contract import hand_over
from search.errors import SearchError, SpecError
from search.record.study import load_study
from search.report.after_run import after_run, no_trial_completed
from search.result import SearchResult
from search.specs.schema import StudySpec, parse_spec, read_spec_file, read_yaml, set_dotted
from search.tuning.notebook import in_notebook
from search.tuning.options import RunOptions
from search.tuning.preflight import check_run
from search.tuning.runner import run_study
from search.tuning.signals import EXIT_STATUS
from search.tuning.terminal import console

SpecLike = str | Path | Mapping[str, Any]
"""A spec: a YAML file's path, YAML text, or the same data as a mapping."""


class RunStoppedError(SearchError):
    """The run stopped before its budget: its first trials all failed alike."""


def run(
    spec: SpecLike,
    *,
    trainable: Callable[..., Any] | str | None = None,
    data: Any = None,
    trials: int | None = None,
    max_epochs: int | None = None,
    study: str | None = None,
    storage: str | None = None,
    seed: int | None = None,
    results: Path | str = "results",
    address: str | None = None,
    restart: bool = False,
) -> SearchResult:
    """Runs a study, as ``python -m search run`` does, and returns its :class:`SearchResult`.

    Args:
        spec: A YAML file's path, YAML text, or a mapping of the same.
        trainable: The trainable: a function (one defined in a notebook's cell works), or
            a name as the spec gives one; it replaces the spec's ``trainable``.
        data: What every trial receives as ``data``: an object, or a function that returns
            it (called once, here); it replaces the spec's ``data``.
        trials: Overrides ``budget.trials``.
        max_epochs: Overrides ``budget.max_epochs``.
        study: Overrides the study's name.
        storage: Overrides the storage URL.
        seed: Overrides ``sampler.seed``.
        results: The folder for results (``results/<study>/``).
        address: A Ray cluster to join (as ``--address``); unset, ``$RAY_ADDRESS`` as the
            command reads it (and as ``ray.init`` does); a local Ray of the run's own otherwise.
        restart: Deletes the study first and starts afresh.

    Raises:
        search.errors.SpecError: The spec, in one line naming the field.
        search.errors.SearchError: Anything else the command refuses in one line (another
            driver runs the study, the storage cannot be opened, ...);
            :class:`RunStoppedError` when its first trials all failed alike.
        KeyboardInterrupt: After Ctrl-C (a kernel's interrupt) stopped the run, once every
            trial is recorded and the summary printed.
    """
    source = "search.run"
    address = address or os.environ.get("RAY_ADDRESS") or None  # as `run --address` reads it
    parsed = _spec(spec, source, trainable, data, _overrides(locals()))
    check_run(parsed, address, storage_field="storage", data_field="data", source=source)
    options = RunOptions(
        results_dir=Path(results),
        address=address,
        restart=restart,
        source=source,
        notebook=in_notebook(),
    )
    summary = run_study(parsed, options)
    done = load_study(parsed.study, parsed.storage)
    after_run(console(), done, parsed, summary, Path(results))
    if summary.interrupted_by_user:
        raise KeyboardInterrupt("the run stopped at Ctrl-C; the same call continues the study")
    if summary.terminated:  # SIGTERM: as the command exits (search/tuning/signals.py)
        raise SystemExit(EXIT_STATUS)
    if summary.stopped_early:
        raise RunStoppedError(f"{summary.stopped_early}; fix it and run again")
    if summary.states and "COMPLETE" not in summary.states.values():
        print(f"warning: {no_trial_completed(done, summary.states)}", file=sys.stderr)
    return SearchResult(parsed.study, parsed.storage, results)


def _overrides(given: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's dotted fields that :func:`run`'s keyword arguments set."""
    fields = {"trials": "budget.trials", "max_epochs": "budget.max_epochs", "seed": "sampler.seed"}
    names = ("trials", "max_epochs", "study", "storage", "seed")
    return {fields.get(k, k): given[k] for k in names}


def _spec(
    spec: SpecLike, source: str, trainable: Any, data: Any, changes: dict[str, Any]
) -> StudySpec:
    """The validated spec: ``spec`` read, ``trainable`` and ``data`` handed over, ``changes``
    set (each named in the error line as ``search.run``'s)."""
    raw = _raw(spec, source)
    if trainable is not None:
        raw["trainable"] = trainable if isinstance(trainable, str) else hand_over(trainable)
    if data is not None:
        raw["data"] = {"loader": hand_over(data if callable(data) else _given(data))}
    return parse_spec(set_dotted(raw, changes), source)


def _raw(spec: SpecLike, source: str) -> dict[str, Any]:
    """The spec's data, not yet validated: a mapping copied, a path read, YAML text parsed."""
    if isinstance(spec, Mapping):
        return copy.deepcopy(dict(spec))
    if isinstance(spec, Path) or (
        isinstance(spec, str) and "\n" not in spec and spec.endswith((".yaml", ".yml"))
    ):
        data = read_spec_file(spec)
    elif isinstance(spec, str):
        data = read_yaml(spec, source)
    else:
        raise SpecError(source, "spec", f"expected a path, YAML text or a dict, got {spec!r}")
    if not isinstance(data, dict):
        raise SpecError(str(spec) if isinstance(spec, Path) else source, "", "expected a mapping")
    return data


def _given(data: Any) -> Callable[[], Any]:
    """A loader that returns ``data`` (named ``__main__:data`` in the spec)."""

    def given() -> Any:
        return data

    given.__module__, given.__qualname__ = "__main__", "data"
    return given
