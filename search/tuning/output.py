"""A trial's own output: its process's stdout and stderr, captured into ``output.log``.

The capture is at the file-descriptor level (``os.dup2`` of fds 1 and 2 onto the file), so
what C extensions and child processes write lands there too, not only Python's ``print``. A
Ray actor runs many trials one after another, so the descriptors are restored after each
trial and the next one opens its own file; a retried trial appends to the file it had. The
other ranks of a data-parallel trial write beside it (:mod:`search.compute.distributed`).

When a trial ends, the driver attaches the end of each of its output files to it
(:func:`attach_output`), so optuna-dashboard shows a trial's output in its artifacts.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from search.compute.distributed import rank_logs
from search.record.artifacts import TAIL_BYTES, attach_tail

if TYPE_CHECKING:
    import optuna

LOG_FILE = "output.log"
"""The file, in the trial's folder beside ``traceback.txt``, that holds its output."""


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


@contextlib.contextmanager
def captured(trial_dir: str | Path) -> Iterator[Path | None]:
    """Sends fds 1 and 2 of this process to ``trial_dir/output.log`` until the block ends.

    Args:
        trial_dir: The trial's folder (created if it is not there).

    Yields:
        The log's path, or ``None`` when it could not be opened (the output then goes where
        it went before, and the trial runs anyway).
    """
    path = Path(trial_dir) / LOG_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        file = open(path, "ab", buffering=0)  # noqa: SIM115 (closed in the finally below)
    except OSError:
        yield None
        return
    try:
        saved = (os.dup(1), os.dup(2))
    except OSError:  # no stdout or stderr to restore afterwards: leave them as they are
        file.close()
        yield None
        return
    _flush()
    try:
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
        yield path
    finally:
        _flush()
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)
        file.close()


def attach_output(
    study: optuna.Study,
    number: int,
    log: str | Path | None,
    results_dir: Path,
    limit: int = TAIL_BYTES,
) -> list[str]:
    """Attaches the end of trial ``number``'s output (``log`` and every other rank's file
    beside it; at most ``limit`` bytes of each) to the trial, as the text artifacts
    ``trial-<number>-output.log`` (and ``trial-<number>-output.rank<N>.log``).

    Returns:
        The names attached; none when the trial has no log or its files cannot be read
        (the output is then left out: the study and the run go on).
    """
    if not log:
        return []
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    names = []
    for path in rank_logs(log).values():
        name = f"trial-{number:04d}-{path.name}"
        try:
            attach_tail(study, trial_id, path, name, results_dir, limit)
        except OSError:
            continue
        names.append(name)
    return names
