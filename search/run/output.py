"""A trial's own output: its process's stdout and stderr, captured into ``output.log``.

The capture is at the file-descriptor level (``os.dup2`` of fds 1 and 2 onto the file), so
what C extensions and child processes write lands there too, not only Python's ``print``. A
Ray actor runs many trials one after another, so the descriptors are restored after each
trial and the next one opens its own file; a retried trial appends to the file it had.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

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
