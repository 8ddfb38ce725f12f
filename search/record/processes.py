"""A run's processes on its machine, told apart from later ones that reuse their pids.

A process is named by its pid and its start time (clock ticks since boot, as ``/proc/PID/stat``
says): a pid handed out again later starts at another time, and a reboot changes the boot id
the lease records beside them. The lease (:mod:`search.record.lease`) names its driver so, and
the processes of the local Ray that driver started: Ray's dashboard and runtime-env agents
outlive a driver killed with ``kill -9`` (its raylet dies, they do not, and they ignore
SIGTERM), so the next run on that machine stops them (:func:`stop`), and only them.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Sequence
from pathlib import Path


def proc(pid: int | str) -> tuple[str, str]:
    """``(pid, start time)`` of a process as ``/proc`` names it; ``("", "")`` when gone.

    The pid is the one of ``/proc``'s own PID namespace (a driver in a container or under
    ``unshare -p`` may see itself as PID 1), so a later reader of the same ``/proc`` finds it.
    """
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.split(" ", 1)[0], stat.rsplit(")", 1)[1].split()[19]
    return "", ""


def _children() -> dict[int, list[int]]:
    """Every process's children, from the parent pids in ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    return children


def tree(roots: Iterable[int]) -> list[int]:
    """``roots`` and all their descendants, parents first (dead roots included: their
    children, reparented, are not found from them).

    Example:
        >>> tree([os.getpid()])[0] == os.getpid()
        True
    """
    children = _children()
    found = list(roots)
    for pid in found:  # grows as it goes: children after their parent
        found.extend(children.get(pid, ()))
    return list(dict.fromkeys(found))


def named(pids: Iterable[int]) -> list[list[str]]:
    """``[pid, start time]`` of each of ``pids`` that is alive (as the lease stores them)."""
    return [list(identity) for identity in map(proc, pids) if identity[0]]


def stop(recorded: Iterable[Sequence[str]]) -> int:
    """SIGKILLs each recorded ``[pid, start time]`` that is still that process (a pid now held
    by another process, with another start time, is left alone); returns how many it killed."""
    killed = 0
    for pid, start in (tuple(map(str, r)) for r in recorded if len(r) == 2):
        if start and proc(pid) == (pid, start):
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
                killed += 1
    return killed
