"""What runs inside a Ray trial: drive a trainable's generator, one Tune report per epoch.

This is the only code that runs in the trial's process. It resolves the trainable (imported
once per reused actor, not once per trial), builds the trial's context (its seed, threads,
device and GPU share; the trainable seeds its own generators from ``ctx.seed``), turns the
state the trainable saves into a Tune checkpoint now and then (so a retried trial resumes near
where it failed; see :func:`_checkpoint`), and stops the trial itself at the first NaN
or infinite metric, so ASHA never has to run a diverged trial to the end.

A user's error is not retried twice. Tune retries whatever raises (``faults.max_failures``),
and an error of :data:`search.contract.driver.NOT_RETRIED` ends the trial at once; any other
error ends it when it repeats identically on its retry: the same type and message, at the same
epoch or before (:func:`_again`). An error that changes, or comes later than the one before,
keeps the trial's retries, and so do a GPU out of memory (:mod:`search.tuning.oom`), a full
disk (:mod:`search.tuning.faults`) and a dead process or node (:mod:`search.tuning.death`),
which have rules of their own.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import socket
import tempfile
import time
import traceback
from collections.abc import Mapping
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search.compute.distributed import data_parallel
from search.compute.job import TrialJob, trial_context
from search.compute.limits import apply_limits
from search.contract import RESERVED_PREFIX, TrialContext, declarations, drive, receive
from search.contract.driver import NOT_RETRIED
from search.contract.named import code_names
from search.contract.reads import ReadConfig
from search.errors import disk_full, error_summary
from search.tuning.death import exit_noted
from search.tuning.fate import (
    CODE_ERROR,
    DEVICE,
    DROPPED,
    EPOCH,
    FAIL_REASON,
    LIMITS,
    LOG,
    METRIC_KEYS,
    MISSED,
    NO_VALUE,
    NODE,
    NUMBER,
    REPLICAS,
    SEED,
    TRACEBACK,
    UNREAD,
)
from search.tuning.oom import out_of_memory
from search.tuning.output import captured

if TYPE_CHECKING:
    from search.contract import Dataset

EPOCH_FILE = "search_epoch.json"
"""Written by the worker into every checkpoint: the epoch it holds."""
ERROR_FILE = "search_error.json"
"""Written beside a trial's ``output.log`` by an attempt that raised (and is retried): its
error, the epoch it raised in and how many attempts failed, for the next attempt to compare."""
NOT_RETRIED_NOTE = " (not retried: it fails the same way every time)"


def _placement() -> tuple[str, str]:
    """The trial's device (``cpu`` or ``cuda`` with Ray's GPU ids) and Ray node."""
    import ray

    gpu_ids = ray.get_gpu_ids()
    device = f"cuda ({','.join(str(i) for i in gpu_ids)})" if gpu_ids else "cpu"
    node = ray.get_runtime_context().get_node_id()[:12]
    return device, f"{socket.gethostname()}/{node}"


def _restored() -> tuple[str | None, int]:
    """The folder of the checkpoint Tune restored (if any) and the epoch it holds."""
    from ray import tune

    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return None, 0
    folder = tempfile.mkdtemp(prefix="search-restore-")
    checkpoint.to_directory(folder)
    epoch = json.loads((Path(folder) / EPOCH_FILE).read_text())["epoch"]
    return folder, int(epoch)


def _gpu_share() -> float | None:
    """The share of a GPU Ray holds for this trial now (a retry may hold more than planned)."""
    from ray import tune

    resources = tune.get_context().get_trial_resources()
    share = getattr(resources, "required_resources", {}).get("GPU")
    return float(share) if share else None


def _context(config: Mapping[str, Any], job: TrialJob, device: str) -> TrialContext:
    from ray import tune

    restore_dir, done = _restored()
    share = _gpu_share() if device != "cpu" else None
    return trial_context(
        job,
        seed=int(config.get(SEED, 0)),
        number=int(config.get(NUMBER, 0)),
        device=device,
        trial_dir=tune.get_context().get_trial_dir() or ".",
        share=job.share.holding(share),
        checkpoint_dir=tempfile.mkdtemp(prefix="search-ckpt-") if job.checkpoints else None,
        restore_dir=restore_dir,
        start_epoch=done + 1,
    )


_SAVED: dict[str, tuple[tuple[Any, ...], float]] = {}
"""Checkpoint folder -> what its files were when they last became a Tune checkpoint (nothing
at the attempt's start), and when."""


def _checkpoint(ctx: TrialContext, epoch: int, every_s: float) -> Any:
    """The epoch's Tune checkpoint, when the trainable saved new state into ``checkpoint_dir``
    and ``every_s`` (``faults.checkpoint_every_s``) passed since the attempt started or since
    the last checkpoint.

    Each Tune checkpoint costs a copy into the experiment folder and work in Ray's driver loop,
    the loop that starts trials and reads every result (a large share of the wall time of short
    trials when every one made one). A retry resumes from the last one, so it trains again at most
    ``every_s`` (plus one epoch); a trial shorter than that makes none.

    A trainable that saves only on some epochs leaves the folder as it was: then no checkpoint
    is made, and Tune keeps the last one, labelled with the epoch it really holds.
    """
    from ray import tune

    folder = ctx.checkpoint_dir
    if folder is None:
        return None
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.name != EPOCH_FILE)
    state = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    last = _SAVED.setdefault(folder, ((), time.monotonic()))
    now = time.monotonic()
    if not state or last[0] == state or now - last[1] < every_s:
        return None
    _SAVED[folder] = (state, now)
    (Path(folder) / EPOCH_FILE).write_text(json.dumps({"epoch": epoch}))
    return tune.Checkpoint.from_directory(folder)


def _failed(metric: str, metrics: Mapping[str, Any], reason: str) -> dict[str, Any]:
    """What a failing epoch's report adds: the reason and, where the objective is missing or
    not a number, a NaN in its place (Tune's scheduler needs a number) marked as no value, and
    as the code's own failure (no retry, nor the next trial, would do better)."""
    added: dict[str, Any] = {FAIL_REASON: reason}
    if metric and not isinstance(metrics.get(metric), float):
        added.update({metric: math.nan, NO_VALUE: True, CODE_ERROR: True})
    return added


def _log_dir(ctx: TrialContext) -> str:
    """The trial's folder under the run's results (``results/ray/<study>/<trial>``), where its
    output is written as it comes; the staging folder Ray syncs from when the storage is not
    a local file system."""
    from ray import tune

    try:
        storage = tune.get_context().get_storage()
        if storage.storage_filesystem.type_name == "local":
            return str(storage.trial_fs_path)
    except (AttributeError, RuntimeError, ValueError):
        pass
    return ctx.trial_dir


def _code_error(exc: BaseException, ctx: TrialContext, note: str = NOT_RETRIED_NOTE) -> dict:
    """The report of a trial that raised an error no retry fixes: one of :data:`NOT_RETRIED`,
    or one that repeated on its retry (``note`` says which)."""
    path = Path(_log_dir(ctx)) / "traceback.txt"  # beside output.log
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(traceback.format_exception(exc)))
    except OSError:
        path = Path("(not written)")
    return {FAIL_REASON: error_summary(exc) + note, TRACEBACK: str(path), CODE_ERROR: True}


def _again(exc: BaseException, epoch: int, folder: Path) -> str | None:
    """The note of an error the trial's attempt before raised too, at ``epoch`` or later
    (``" (again on retry 1: not retried further)"``): the trial ends with it. ``None`` when a
    retry may do better (another error, one further on, a GPU out of memory, a full disk),
    once the error is noted in ``folder``'s :data:`ERROR_FILE` for the next attempt.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _again(ValueError("bad"), 2, folder) is None  # the first attempt: retried
        True
        >>> _again(ValueError("worse"), 2, folder) is None  # another error: retried
        True
        >>> _again(ValueError("worse"), 3, folder) is None  # further on than before: retried
        True
        >>> _again(ValueError("worse"), 3, folder)
        ' (again on retry 3: not retried further)'
    """
    summary = error_summary(exc)
    if out_of_memory(summary) or disk_full(exc) is not None:
        return None
    path = folder / ERROR_FILE
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        earlier = {}
    failed = int(earlier.get("attempts", 0))  # earlier attempts that failed
    if earlier.get("error") == summary and int(earlier.get("epoch", 0)) >= epoch:
        return f" (again on retry {failed}: not retried further)"
    with contextlib.suppress(OSError):  # not noted: the retry is retried as before
        path.write_text(json.dumps({"error": summary, "epoch": epoch, "attempts": failed + 1}))
    return None


def run_trial(config: dict[str, Any], job: TrialJob, data: Dataset) -> None:
    """The Ray Tune function trainable: one ``tune.report`` per epoch the trainable yields,
    the trial's stdout and stderr captured into ``output.log`` in its folder (with what ends
    the process, should it die: :func:`~search.tuning.death.exit_noted`). A declared trainable's
    ``@trainable(defaults=...)`` fill the knobs the trial's config lacks, as they do in an
    exported config (:func:`search.handover.candidates.resolved_config`)."""
    receive(dict(job.handed))  # a notebook's trainable comes with the job
    found = declarations(job.trainable)  # imports its module (and its framework)
    config = {**(found.defaults or {}), **config}
    device, node = _placement()
    ctx = _context(config, job, device)
    with captured(_log_dir(ctx)) as log, exit_noted():
        where = {DEVICE: device, NODE: node, **({LOG: str(log)} if log else {})}
        _run(found.train, config, job, data, ctx, where, log, watch_reads=not found.declared)


def _run(
    train: Any,
    config: dict[str, Any],
    job: TrialJob,
    data: Dataset,
    ctx: TrialContext,
    where: dict[str, Any],
    log: Path | None = None,
    watch_reads: bool = False,
) -> None:
    """Drives one attempt of the trial; ``where`` goes into every report. ``log``: the
    trial's ``output.log``, beside which the other ranks of a data-parallel trial write.
    ``watch_reads`` (a plain function's trial, in one process): each report also says which
    config keys it has not read yet (:mod:`search.contract.reads`), or, once it read its
    config in bulk (merged its defaults), which of those its code never names
    (:mod:`search.contract.named`)."""
    from ray import tune

    if ctx.checkpoint_dir:  # the attempt starts: its first checkpoint comes every_s later
        _SAVED[ctx.checkpoint_dir] = ((), time.monotonic())
    limits = apply_limits(ctx)
    params = {k: v for k, v in config.items() if not k.startswith(RESERVED_PREFIX)}
    reads = ReadConfig(params) if watch_reads and job.workers == 1 else None
    if job.workers > 1:
        epochs = data_parallel(job.trainable, params, data, ctx, job.workers, log)
    else:
        epochs = train(params if reads is None else reads, data, ctx)
    planned = job.workers * job.share.replicas
    last = ctx.start_epoch - 1
    named: frozenset[str] | None = None  # the code's names: read once, after a bulk read
    try:
        with closing(drive(epochs, job.max_epochs, ctx.start_epoch, job.required)) as run:
            for epoch in run:
                replicas = int(epoch.metrics.get("replicas", planned))  # what it really used
                report = {
                    **epoch.metrics,
                    **where,
                    EPOCH: epoch.number,
                    REPLICAS: replicas,
                    METRIC_KEYS: sorted(epoch.metrics),
                    LIMITS: json.dumps(limits),
                }
                if epoch.dropped:
                    report[DROPPED] = list(epoch.dropped)
                if reads is not None:
                    if reads.bulk and named is None:  # walks sys.modules: not every epoch
                        named = code_names(train)
                    report.update({UNREAD: reads.unread(named), MISSED: reads.missed()})
                if epoch.fail_reason:
                    report.update(_failed(job.metric, epoch.metrics, epoch.fail_reason))
                checkpoint = (
                    None
                    if epoch.fail_reason
                    else _checkpoint(ctx, epoch.number, job.checkpoint_every_s)
                )
                tune.report(report, checkpoint=checkpoint)
                last = epoch.number
        if last == 0:
            failed = _failed(job.metric, {}, "the trainable yielded no epoch")
            tune.report({**failed, **where, EPOCH: 0})
    except NOT_RETRIED as exc:
        failed = _failed(job.metric, {}, "")
        tune.report({**failed, **_code_error(exc, ctx), **where, EPOCH: last})
    except Exception as exc:
        note = _again(exc, last + 1, Path(_log_dir(ctx)))
        if note is None:
            raise  # Tune retries it (faults.max_failures)
        failed = _failed(job.metric, {}, "")
        tune.report({**failed, **_code_error(exc, ctx, note), **where, EPOCH: last})
    finally:
        for folder in (ctx.checkpoint_dir, ctx.restore_dir):
            if folder:
                _SAVED.pop(folder, None)  # a reused actor runs many trials
                shutil.rmtree(folder, ignore_errors=True)
