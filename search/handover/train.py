"""Training one config outside Ray Tune: confirmation runs, the final model, ``train``.

Each run drives the trainable with :func:`search.contract.drive`, the loop Ray trials use,
with the context :func:`search.compute.job.trial_context` builds for a trial of the spec, and
the threads and memory cap a trial gets (:func:`search.compute.limits.prepare`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.compute.data import load_data
from search.compute.job import trial_context, trial_job
from search.compute.limits import disarm, prepare
from search.compute.quiet import native_noise_filtered
from search.contract import Epoch, declarations, drive, nonfinite_reason
from search.contract.driver import no_model, returns_model
from search.errors import SearchError

if TYPE_CHECKING:
    from search.contract import Dataset
    from search.specs.schema import StudySpec

Log = Callable[[str], None]
_LOAD: Any = object()
"""``train_spec``'s default ``data``: load the spec's (a loader may return ``None``)."""


class ExportError(SearchError):
    """The study cannot be exported (no COMPLETE trial, no export hook, every run failed)."""


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


def train_once(
    spec: StudySpec,
    config: Mapping[str, Any],
    data: Dataset,
    *,
    seed: int,
    folder: str,
    number: int = 0,
    device: str = "cpu",
    on_epoch: Callable[[Epoch], None] | None = None,
) -> tuple[list[dict[str, float]], str | None, dict[str, Any]]:
    """Trains ``config`` to the spec's epoch budget in this process, profiling off.

    Returns:
        Each epoch's numeric metrics, why the run failed (``None`` when it did not), and the
        limits applied to the process (:func:`search.compute.limits.apply_limits`).
    """
    ctx = trial_context(
        trial_job(spec, data), seed=seed, number=number, device=device, trial_dir=folder
    )
    history: list[dict[str, float]] = []
    reason: str | None = None
    with native_noise_filtered():  # TensorFlow's start-up lines, if the trainable starts it
        declared, limits = prepare(spec.trainable, ctx)
        try:
            train = declared.train(config, data, ctx)
            with closing(drive(train, spec.budget.max_epochs)) as run:
                for epoch in run:
                    metrics = epoch.metrics.items()
                    history.append({k: v for k, v in metrics if isinstance(v, float)})
                    reason = epoch.fail_reason
                    if on_epoch is not None:
                        on_epoch(epoch)
        finally:
            disarm()  # this process may go on (train, export, a test): TF imported later is its own
    return history, reason or (None if history else "the trainable yielded no epoch"), limits


def will_import(spec: StudySpec, source: str) -> str:
    """The line ``export`` and ``train`` print before they import and run the code ``spec``
    names: its trainable and its data loader, and where they were named (``source``). A spec
    stored in a study is whatever the study's storage holds: whoever can write it chooses
    the code these commands run.

    Example:
        >>> from search.specs.schema import parse_spec
        >>> spec = parse_spec({"study": "s", "trainable": "search.testing:curve",
        ...     "objective": {"metric": "acc", "mode": "max"}, "budget": {"trials": 1,
        ...     "max_epochs": 1}, "data": {"loader": "pkg.data:load"}}, "doc")
        >>> print(will_import(spec, "the spec stored in study 's'"))
        importing trainable search.testing:curve and data loader pkg.data:load, as the spec stored in study 's' names them
    """  # noqa: E501
    data = f"the built-in data {spec.data.name!r}" if spec.data.name != "none" else "no data"
    data = f"data loader {spec.data.loader}" if spec.data.loader else data
    return f"importing trainable {spec.trainable} and {data}, as {source} names them"


def train_spec(
    spec: StudySpec,
    out_dir: Path | None = None,
    log: Log | None = None,
    history: list[dict[str, float]] | None = None,
    data: Any = _LOAD,
) -> dict[str, float]:
    """Trains a spec of fixed parameters once, in this process (no Ray), seed ``sampler.seed``.

    With ``out_dir``, the trainable's export hook trains and saves the model there. ``data``:
    what the spec's loader returned, when the caller has it already (``export`` loads once for
    its confirmation runs and its final models); by default the spec's data is loaded here.

    Returns:
        The last epoch's metrics (and what the export hook adds).

    Raises:
        ExportError: When the spec still has a search space, or ``out_dir`` is given and the
            trainable has no export hook, or training failed.
    """
    if spec.space:
        raise ExportError(
            f"space: train takes a spec of fixed parameters (export's "
            f"config.yaml, best.yaml); this one searches {sorted(spec.space)}"
        )
    config, seed = dict(spec.fixed), spec.sampler.seed or 0
    data = load_data(spec.data) if data is _LOAD else data
    history = [] if history is None else history
    with tempfile.TemporaryDirectory(prefix="search-train-") as folder:
        if out_dir is None:
            shown = (lambda e: log(epoch_line(e.number, e.metrics, spec))) if log else None
            runs, reason, _ = train_once(
                spec,
                config,
                data,
                seed=seed,
                folder=folder,
                device=local_device(spec),
                on_epoch=shown,
            )
            history.extend(runs)
            final = dict(runs[-1]) if runs else {}
        else:
            final, reason = export_model(spec, config, data, seed, folder, Path(out_dir), history)
            for number, metrics in enumerate(history, start=1):
                if log:
                    log(epoch_line(number, metrics, spec))
    if reason:
        raise ExportError(f"training {spec.study!r} failed: {reason}")
    return {k: float(v) for k, v in final.items()}


def export_model(
    spec: StudySpec,
    config: Mapping[str, Any],
    data: Dataset,
    seed: int,
    folder: str,
    out_dir: Path,
    history: list[dict[str, float]],
) -> tuple[dict[str, float], str | None]:
    """Trains through the export hook, which saves the model into ``out_dir``."""
    ctx = trial_context(
        trial_job(spec, data),
        seed=seed,
        device=local_device(spec),
        trial_dir=folder,
        history=history,
    )
    with native_noise_filtered():  # TensorFlow's start-up lines, if the hook starts it
        declared, _ = prepare(spec.trainable, ctx)
        try:
            if declared.export is None:
                raise ExportError(no_hook(spec.trainable))
            final = declared.export(config, data, ctx, out_dir)
        finally:
            disarm()
    reason = nonfinite_reason(final, len(history)) if final else "no epoch trained"
    return final, reason


def check_returns_model(spec: StudySpec, config: Mapping[str, Any], data: Dataset) -> None:
    """Refuses, before any confirmation run, a trainable whose export hook needs the model
    (it calls :func:`search.train_to_end`) and whose generator returns none: the hook runs
    once with no epoch to train, on the CPU, into a folder that is then deleted
    (:func:`search.contract.driver.returns_model`).

    Raises:
        ExportError: ``trainable mod:fn returned no model: end it with `return model` ...``.
    """
    found = declarations(spec.trainable)
    if found.export is None:
        return
    with tempfile.TemporaryDirectory(prefix="search-probe-") as folder:
        ctx = trial_context(trial_job(spec, data), seed=0, trial_dir=folder)
        with native_noise_filtered():  # the first place an export may start TensorFlow
            made = returns_model(found.export, config, data, ctx, Path(folder))
        if made is False:
            raise ExportError(no_model(found.train))


def epoch_line(epoch: int, metrics: Mapping[str, float], spec: StudySpec) -> str:
    """``epoch   3 val_accuracy=0.9722 val_loss=0.0950 train_loss=0.1234``."""
    keys = [spec.primary.metric] + [
        k for k in ("val_loss", "train_loss") if k != spec.primary.metric
    ]
    shown = " ".join(f"{k}={metrics[k]:.4f}" for k in keys if k in metrics)
    return f"epoch {epoch:>3} {shown}"


def no_hook(trainable: str) -> str:
    """The one line for a trainable without an export hook: how to declare one.

    Example:
        >>> no_hook("proj.model:fit")  # doctest: +NORMALIZE_WHITESPACE
        "trainable 'proj.model:fit' has no export hook: declare one below the function with
        @fit.exporter, def export(config, data, ctx, out_dir), which trains to the end, saves
        the model into out_dir and returns its metrics (search.keras.train_and_save does all of
        it for a Keras fit)"
    """
    function = trainable.rpartition(":")[2] or "train"
    return (
        f"trainable {trainable!r} has no export hook: declare one below the function with "
        f"@{function}.exporter, def export(config, data, ctx, out_dir), which trains to the "
        "end, saves the model into out_dir and returns its metrics "
        "(search.keras.train_and_save does all of it for a Keras fit)"
    )
