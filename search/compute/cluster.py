"""The Ray a run uses: a local one it starts, or a cluster it joins (with its token).

Every command that runs trials or tasks (``run``, ``export``) calls :func:`init_ray` once.

A local Ray's processes (GCS, raylet and, through the raylet, the trials' workers) start in a
process group of their own (:func:`own_process_group`). SIGTERM to the driver's process group
(``kill -TERM -PGID``, a batch system's ``killpg``) then reaches the driver alone, which stops
Tune and records while its Ray still answers (:mod:`search.tuning.signals`); in the driver's
group, Ray's processes died first, and Tune's clean-up waited out its timeout for the gone
GCS and ended the process with status 1, no summary. They still die with the driver: Ray binds
them to it (``PR_SET_PDEATHSIG``), and the driver stops them when it ends. Ray's dashboard and
runtime-env agents, which the raylet starts, Ray does not bind: a watcher stops them once the
driver is gone, ``kill -9`` included (:func:`search.record.processes.watch_over`).

A local Ray that fails to start (its temp folder unwritable or full, its processes not up in
time on a loaded machine) is one line, :class:`RayStartError`, with what it started stopped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from search.errors import SearchError, disk_full, one_line
from search.record.processes import watch_over

# Tune's per-trial CSV/JSON/TensorBoard loggers cost time on every result and duplicate what
# the Optuna study records; Tune would also chdir each trial into its own folder, which breaks
# relative data paths in specs.
# RAY_AIR_NEW_OUTPUT=0 selects the reporter that honours verbose=0 (our ProgressCallback prints).
# A local Ray's log monitor globs its log folder every 0.1 s while it holds under 1,000 files;
# with threshold 0 it globs twice a second at most. It only forwards worker output to drivers,
# which ours turn off (log_to_driver=False), so later news of a new log file costs nothing.
_RAY_ENV = {
    "PL_DISABLE_FORK": "1",  # what Tune gives every trial actor (ray/tune/execution/class_cache)
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    "RAY_CHDIR_TO_TRIAL_DIR": "0",
    "RAY_AIR_NEW_OUTPUT": "0",
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
}


LOCAL_ENV: dict[str, str] = {}
"""The environment the local Ray this process started inherited (empty when it joined a
cluster): every worker of that Ray has it, so a ``runtime_env`` that only repeats it is
redundant (:func:`search.tuning.actors.inherited_env`)."""

NO_PRESTART = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
"""Ray's settings for no idle workers started ahead of demand: trials run in actors, which
never take a prestarted worker (Ray would start one per CPU for the first driver)."""

LOCAL_SYSTEM_CONFIG = {**NO_PRESTART, "worker_niceness": 0}
"""A local Ray's settings: :data:`NO_PRESTART`, and its workers at the driver's own priority.
Ray starts every worker 15 nicer than its raylet, so that its control plane answers while
the workers fill the CPUs; but the trials are the run's work, and at +15 any other program
on a shared machine (a build, a notebook, a second search) takes nearly all the CPU they
would get: beside two busy loops on this 2-CPU machine, 0.7 CPU-s of a worker's work took
12-24 s at +15 and 0.6-1.5 s at 0. At 0, ``nice python -m search run`` lowers the whole run,
as a Unix user expects."""

NUM_CPUS_ENV = "SEARCH_NUM_CPUS"
NUM_GPUS_ENV = "SEARCH_NUM_GPUS"
"""Logical CPUs and GPUs of the local Ray a run starts (Ray accepts GPUs a machine lacks:
placement tests use 4 logical GPUs on a CPU machine); unset: what the machine has."""


_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def _quiet_token_enabled(record: logging.LogRecord) -> bool:
    """Drops Ray's note that a local cluster enabled token auth; keeps its other warnings
    (token auth *disabled* is a real one)."""
    return "Token authentication is enabled" not in record.getMessage()


_UNHANDLED_LOGGER = "ray._private.worker"
_TRIAL_TASK = re.compile(r"ray::(ImplicitFunc|_Inner)\.train\(\)")
"""How Ray names the task of a Tune trial (a function trainable's ``train`` step)."""


def _quiet_unhandled(record: logging.LogRecord) -> bool:
    """Drops Ray's "Unhandled error" of a Tune trial's task, or of a task that met a full
    disk: the remote traceback of a result Tune dropped unread once the run stopped (a
    trial's error is the study's one line and its traceback file; a full disk, the run's one
    line); keeps every other unhandled error.

    Example:
        >>> def record(msg):
        ...     return logging.makeLogRecord({"msg": "Unhandled error (suppress with ...): " + msg})
        >>> _quiet_unhandled(record("ray::f()\\n  File ...\\nOSError: [Errno 28] No space left"))
        False
        >>> _quiet_unhandled(record("\\x1b[36mray::ImplicitFunc.train()\\x1b[39m\\nValueError"))
        False
        >>> _quiet_unhandled(record("ray::my_task()\\n  File ...\\nValueError: x"))
        True
    """
    text = record.getMessage()
    if not text.startswith("Unhandled error"):
        return True
    return _TRIAL_TASK.search(text) is None and disk_full(RuntimeError(text)) is None


_SPAWNER: list[int] = []
"""The thread whose child processes start in a process group of their own (while it is
inside :func:`own_process_group`); empty otherwise."""
_REGISTERED: list[bool] = []
"""Whether :func:`_leave_group` is registered as a fork hook (once a process)."""


def _leave_group() -> None:
    """In a child just forked: a process group of its own, if :data:`_SPAWNER` forked it."""
    if _SPAWNER and threading.get_ident() == _SPAWNER[-1]:
        with contextlib.suppress(OSError):
            os.setpgrp()


@contextlib.contextmanager
def own_process_group() -> Iterator[None]:
    """Puts the processes this thread starts inside the block each in a process group of its
    own (their children join theirs); other threads' children stay in the caller's.

    Python runs fork hooks in a child that :mod:`subprocess` starts with a ``preexec_fn``,
    as Ray starts its processes (it blocks SIGINT there). POSIX only; elsewhere a no-op.
    """
    if not hasattr(os, "register_at_fork"):
        yield
        return
    if not _REGISTERED:
        os.register_at_fork(after_in_child=_leave_group)
        _REGISTERED.append(True)
    _SPAWNER.append(threading.get_ident())
    try:
        yield
    finally:
        _SPAWNER.pop()


def init_ray(address: str | None, num_cpus: int | None = None, num_gpus: int | None = None) -> bool:
    """Starts a local Ray (or joins ``address``) unless this process already has one; returns
    whether it started a local Ray now (its processes: :func:`local_ray_processes`).

    ``num_cpus`` and ``num_gpus`` (else ``$SEARCH_NUM_CPUS`` and ``$SEARCH_NUM_GPUS``) set the
    local Ray's logical resources; a cluster joined at ``address`` has its own.
    """
    import ray

    if num_cpus is None and os.environ.get(NUM_CPUS_ENV):
        num_cpus = int(os.environ[NUM_CPUS_ENV])
    if num_gpus is None and os.environ.get(NUM_GPUS_ENV):
        num_gpus = int(os.environ[NUM_GPUS_ENV])

    os.environ.update({k: v for k, v in _RAY_ENV.items() if k not in os.environ})
    if ray.is_initialized():
        return False
    use_cluster_token(address)  # Ray 2.60 clusters want RAY_AUTH_MODE=token from drivers
    if address is None:  # a local Ray that turned token auth on says so: news to nobody
        logging.getLogger(_AUTH_LOGGER).addFilter(_quiet_token_enabled)
    logging.getLogger(_UNHANDLED_LOGGER).addFilter(_quiet_unhandled)
    local = address in (None, "local")
    with own_process_group() if address is None else contextlib.nullcontext():
        try:
            _start(address, num_cpus, num_gpus)
        except Exception as exc:
            if local:
                with contextlib.suppress(Exception):
                    ray.shutdown()  # the processes it started before it failed
            if not local or disk_full(exc) is not None:  # --address, a full disk: their line
                raise
            raise RayStartError(start_failed(exc, _ray_temp())) from None
    if local:  # its processes die with this one, kill -9 included, whoever runs next
        with contextlib.suppress(OSError):
            watch_over(local_ray_processes())
    return local


class RayStartError(SearchError):
    """The local Ray a command starts did not start."""


def start_failed(exc: BaseException, temp: str) -> str:
    """The one line for a local Ray that did not start: why, and what to do.

    Args:
        exc: What ``ray.init`` raised.
        temp: Ray's temp folder on this machine.

    Example:
        >>> start_failed(NotADirectoryError(20, "Not a directory", "/f/ray"), "/f/ray")
        "Ray could not start on this machine (NotADirectoryError: [Errno 20] Not a directory: \
'/f/ray'): check the free memory and the space in Ray's temp folder /f/ray (RAY_TMPDIR sets \
where it goes), then run the same command again, or join a running Ray cluster with --address"
    """
    reason = f"{type(exc).__name__}: {one_line(exc, limit=300, where='last')}"
    return (
        f"Ray could not start on this machine ({reason}): check the free memory and the space "
        f"in Ray's temp folder {temp} (RAY_TMPDIR sets where it goes), then run the same "
        "command again, or join a running Ray cluster with --address"
    )


def _ray_temp() -> str:
    """The folder a local Ray writes its sockets, logs and spilled objects under."""
    try:
        from ray._common.utils import get_default_ray_temp_dir

        return str(get_default_ray_temp_dir())
    except (ImportError, AttributeError):  # Ray moved it
        return os.path.join(os.environ.get("RAY_TMPDIR", "/tmp"), "ray")


def _start(address: str | None, num_cpus: int | None, num_gpus: int | None) -> None:
    """``ray.init`` with this project's settings (:func:`init_ray`)."""
    import ray

    local = address in (None, "local")
    # No job runtime_env: a worker with one starts through Ray's setup_worker shim (a second
    # Python start). A local Ray's raylet, and so every worker, inherits this process's
    # environment; on a cluster, the variables a worker reads (PL_DISABLE_FORK,
    # RAY_CHDIR_TO_TRIAL_DIR) reach trial actors through Tune's own runtime_env
    # (search/tuning/actors.py), and the rest are the driver's.
    LOCAL_ENV.clear()
    if local:
        LOCAL_ENV.update(os.environ)
    ray.init(
        # "local": a fresh Ray of this run's own, even when `ray start` left one on this
        # machine (a cluster is joined only when the spec or --address names it).
        address=address or "local",
        num_cpus=None if address else num_cpus,
        num_gpus=None if address else num_gpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=False,
        # Ray starts one idle Python worker per CPU for tasks, but Tune runs every trial in an
        # actor, and actors never take those workers: on a small machine they cost CPU
        # while the first trials start, on a 64-CPU node 64 processes that do nothing.
        _system_config=None if address else LOCAL_SYSTEM_CONFIG,
    )


def local_ray_processes() -> list[int]:
    """The pids of the processes of the local Ray this process started (its GCS, raylet,
    monitors; the raylet starts the rest), none when it joined a cluster."""
    from ray._private import worker

    node = getattr(worker, "_global_node", None)
    if node is None or not getattr(node, "head", False):
        return []
    return [process.pid for _, process in node.live_processes()]


def _ray_token_available() -> bool:
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        return Path(path).expanduser().is_file()
    return (Path.home() / ".ray" / "auth_token").is_file()


def use_cluster_token(address: str | None) -> None:
    """Turns on Ray's token authentication for a driver that joins a cluster.

    ``ray start --head`` (Ray 2.60) turns token authentication on and writes the token to
    ``~/.ray/auth_token``; a driver joining the cluster must then set ``RAY_AUTH_MODE=token``.
    When ``RAY_AUTH_MODE`` is unset and a token is at hand (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``), this sets it. A token-mode driver also
    joins a cluster without authentication, so this is safe either way.
    """
    if address in (None, "local") or "RAY_AUTH_MODE" in os.environ:
        return
    if not _ray_token_available():
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    if "ray" in sys.modules:  # Ray reads its config once, on import: refresh it as Ray does
        with contextlib.suppress(ImportError, AttributeError):
            from ray._raylet import Config  # type: ignore[attr-defined]

            Config.initialize("")


@contextlib.contextmanager
def untagged_callbacks() -> Iterator[None]:
    """Tune without its usage tag of the run's callbacks.

    ``tune.run`` counts the callbacks by class for Ray's usage statistics, and to know the
    classes it imports its MLflow integration, which imports MLflow: a slow import in every run,
    for a tag that is never sent (``ray.init`` turns usage statistics off for release wheels).
    Ray offers no switch for it, so the tag is skipped while the block runs, and restored.
    """
    try:
        from ray.air._internal import usage
    except ImportError:  # Ray moved it: nothing to skip
        yield
        return
    tag = getattr(usage, "tag_callbacks", None)
    if tag is None:
        yield
        return
    usage.tag_callbacks = lambda callbacks: False
    try:
        yield
    finally:
        usage.tag_callbacks = tag
