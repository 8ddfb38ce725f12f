"""One trial, several processes: data-parallel training (PyTorch DDP) inside a Tune trial.

When a trial has several workers (``gpus_per_trial: 2`` or more, or ``workers_per_trial: 2`` on
CPU), the trial's Ray actor starts that many worker processes (``python -m
search.compute.distributed``), each with its own end of a socket pair. Every worker runs the same
trainable generator with ``ctx.rank`` and ``ctx.world_size`` set; the trainable (the
PyTorch built-ins' loop, ``trainables/torch/loop.py``) wraps its model in
``DistributedDataParallel``, gives each rank its shard of every global batch and all-reduces
the metrics. Rank 0 sends each epoch's metrics to the actor and waits until the actor asks for
the next epoch, exactly like a generator paused at its ``yield``; so Tune, ASHA and the Optuna
record see one trial with one report per epoch, and the checkpoint rank 0 writes is never
overwritten while Tune copies it. When ASHA stops the trial (the generator is closed) or a
worker fails, the actor kills the workers.

Why this and not Ray Train's ``TorchTrainer`` inside the Tune trial: a nested trainer needs
its own placement group and worker actors per trial, reports through Ray Train's session
instead of the trial's generator, and does not combine with ``reuse_actors``. Why a new
interpreter (``python -m``) and not ``torch.multiprocessing.spawn``: spawn re-imports the
parent's ``__main__``, which in a Ray worker is Ray's own worker script. The processes use
``CUDA_VISIBLE_DEVICES`` as Ray set it for the actor (rank r trains on the r-th of the trial's
GPUs, NCCL) or, without GPUs, the gloo backend; they rendezvous through a file store in a
private temporary folder (no port to race for).

Output: rank 0 writes where the actor writes (the trial's ``output.log``, captured by the
worker); every other rank, given the log's path, writes its stdout and stderr beside it, to
``output.rank<N>.log`` (:func:`rank_log`), so ``search logs --rank N`` shows one process's
lines unmixed.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from search.compute.limits import prepare

if TYPE_CHECKING:
    from search.contract import Dataset, Metrics, TrialContext

FD_ENV = "SEARCH_DDP_FD"


def _send(conn: Connection, message: tuple[str, Any]) -> None:
    try:
        conn.send(message)
    except (pickle.PicklingError, TypeError, AttributeError):  # an exception that won't pickle
        kind, payload = message
        conn.send((kind, RuntimeError(f"{type(payload).__name__}: {payload}")))


def rank_log(log: str | Path, rank: int) -> Path:
    """Where rank ``rank`` of a trial whose output is ``log`` writes its own.

    Example:
        >>> rank_log("trial/output.log", 0), rank_log("trial/output.log", 2)
        (PosixPath('trial/output.log'), PosixPath('trial/output.rank2.log'))
    """
    path = Path(log)
    return path if rank == 0 else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def rank_logs(log: str | Path) -> dict[int, Path]:
    """The output files of a trial whose output is ``log``, by rank (0 first): ``log`` and
    each :func:`rank_log` beside it that is there."""
    path = Path(log)
    pattern = re.compile(rf"{re.escape(path.stem)}\.rank(\d+){re.escape(path.suffix)}")
    found = (pattern.fullmatch(p.name) for p in path.parent.glob(f"{path.stem}.rank*"))
    others = sorted(int(m.group(1)) for m in found if m)
    return {r: rank_log(path, r) for r in ([0] if path.is_file() else []) + others}


class WorkerLost(RuntimeError):
    """A training process of the trial died without saying why (killed, crashed)."""


def data_parallel(
    trainable: str,
    params: Mapping[str, Any],
    data: Dataset,
    ctx: TrialContext,
    workers: int,
    log: str | Path | None = None,
) -> Iterator[Metrics]:
    """Trains one trial with ``workers`` processes; yields rank 0's metrics once per epoch.

    Closing the generator (ASHA stopped the trial) kills the processes. With ``log`` (the
    trial's ``output.log``), ranks above 0 append their output to :func:`rank_log` of it;
    without, every rank writes to this process's stdout and stderr.
    """
    folder = tempfile.mkdtemp(prefix="search-ddp-")
    store = f"file://{folder}/store"
    path = dict.fromkeys(os.path.abspath(p or ".") for p in sys.path)  # what this process imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    procs: list[subprocess.Popen[bytes]] = []
    conns: list[Connection] = []
    try:
        for rank in range(workers):
            ours, theirs = socket.socketpair()
            child_env = {**env, FD_ENV: str(theirs.fileno())}
            with _output(log, rank) as out:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "search.compute.distributed"],
                        env=child_env,
                        pass_fds=(theirs.fileno(),),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=out,
                    )
                )
            theirs.close()
            conns.append(Connection(ours.detach()))
            rank_ctx = replace(
                ctx,
                rank=rank,
                world_size=workers,
                profile=ctx.profile and rank == 0,
                checkpoint_dir=ctx.checkpoint_dir if rank == 0 else None,
            )
            conns[rank].send((trainable, dict(params), data, rank_ctx, store))
        done: set[int] = set()
        while len(done) < workers:
            # A process that dies closes its socket: wait() wakes and recv() raises EOFError.
            waiting = [c for r, c in enumerate(conns) if r not in done]
            for rank in sorted(conns.index(c) for c in wait(waiting)):  # type: ignore[arg-type]
                conn = conns[rank]
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):
                    code = procs[rank].wait()
                    raise WorkerLost(
                        f"training process {rank} of {workers} exited with status {code}"
                    ) from None
                if kind == "error":
                    raise _own_error(_as_error(payload), [c for c in conns if c is not conn])
                if kind == "done":
                    done.add(rank)
                elif kind == "epoch":
                    yield payload
                    conn.send("next")
    finally:
        for conn in conns:
            conn.close()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for proc in procs:
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _as_error(payload: object) -> BaseException:
    return payload if isinstance(payload, BaseException) else RuntimeError(payload)


def _peer_gone(error: BaseException) -> bool:
    """Whether ``error`` is what a rank gets when another rank stopped mid-collective (gloo's
    ``Connection reset by peer``, NCCL's watchdog), not a failure of its own."""
    text = f"{type(error).__name__} {error}"
    return "DistBackendError" in text or "gloo" in text or "NCCL" in text


def _own_error(
    first: BaseException, others: list[Connection], grace_s: float = 5.0
) -> BaseException:
    """The error to end the trial with once a rank failed: when the first to arrive is only
    a peer's connection error, the failing rank's own error, should it come within
    ``grace_s`` (which rank's message arrives first is a race)."""
    deadline = time.monotonic() + grace_s
    pending = list(others)
    while _peer_gone(first) and pending and (left := deadline - time.monotonic()) > 0:
        for ready in wait(pending, timeout=left):  # type: ignore[arg-type]
            conn = cast(Connection, ready)
            pending.remove(conn)
            with contextlib.suppress(EOFError, OSError):
                kind, payload = conn.recv()
                if kind == "error" and not _peer_gone(error := _as_error(payload)):
                    return error
    return first


@contextlib.contextmanager
def _output(log: str | Path | None, rank: int) -> Iterator[BinaryIO | None]:
    """The file rank ``rank`` writes to (``None``: this process's own stdout and stderr),
    open while the process starts; a file that cannot be opened leaves the output where it
    was, and the rank trains anyway."""
    if log is None or rank == 0:
        yield None
        return
    try:
        file = rank_log(log, rank).open("ab", buffering=0)
    except OSError:
        yield None
        return
    with file:
        yield file


def _worker(conn: Connection) -> None:
    """One training process: join the group, run the generator, report (rank 0).

    Every error, from joining the group to the last epoch, goes to the actor as it is."""
    trainable, params, data, ctx, store = conn.recv()
    rank, world = ctx.rank, ctx.world_size
    try:
        import torch
        import torch.distributed as dist

        cuda = ctx.device.startswith("cuda")
        if cuda:
            torch.cuda.set_device(rank)
        declared, _ = prepare(trainable, ctx)  # this process's threads, as every trial's
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=store,
            rank=rank,
            world_size=world,
        )
        try:
            for metrics in declared.train(params, data, ctx):
                if rank == 0:
                    _send(conn, ("epoch", metrics))
                    if conn.recv() != "next":
                        return
            _send(conn, ("done", None))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:
        _send(conn, ("error", exc))
        raise


def main() -> None:
    """Entry point of ``python -m search.compute.distributed`` (by :func:`data_parallel`)."""
    conn = Connection(int(os.environ[FD_ENV]))
    try:
        _worker(conn)
    except BaseException:
        time.sleep(0.1)  # let the error message leave before the socket closes
        sys.exit(1)
    finally:
        conn.close()


if __name__ == "__main__":
    main()
