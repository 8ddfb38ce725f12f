"""A run's processes on its machine, told apart from later ones that reuse their pids, and
from any process a lease merely names.

A process is named by its pid and its start time (clock ticks since boot, as ``/proc/PID/stat``
says): a pid handed out again later starts at another time, and a reboot changes the boot id
the lease records beside them. The lease (:mod:`search.record.lease`) names its driver so, and
the processes of the local Ray that driver started: Ray's dashboard and runtime-env agents
outlive a driver killed with ``kill -9`` (its raylet dies, they do not, and they ignore
SIGTERM), so the next run on that machine stops them (:func:`stop`), and only them.

A lease is data that whoever can write the storage can forge, and ``/proc`` tells anyone any
process's start time. So a process is stopped only when it also proves it is the run's own:
its environment, set when it started, holds :data:`RUN_ENV` with the run's id (the driver sets
it before it starts Ray: :func:`mark`; Ray's processes inherit it). A process the run did not
start never has it, and a process of another user cannot be read (nor killed) at all. Ray's
Python agents rename themselves (``ray::DashboardAgent``), which overwrites the environment
``/proc`` shows; such a process passes only as what it is: a Ray process whose Ray is gone (its
parent is no Ray process any more: :func:`ray_orphan`), never one a live Ray owns.

The lease's stop works only for a next run on the same machine. So a driver that starts a
local Ray also starts a watcher (:func:`watch_over`): a small process of its own session that
follows the Ray's processes while the driver lives and, once the driver is gone however it
went (``kill -9`` included), kills those that are still the same processes. The driver holds
the write end of a pipe the watcher reads; the kernel closes it when the driver dies. The
watcher takes its pids from the driver, never from the storage, and runs this file as a
script (the standard library only), so it costs no import of the package.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

RUN_ENV = "SEARCH_RUN_ID"
"""The environment variable that names the run whose driver started a process."""


def mark(run_id: str) -> None:
    """Names ``run_id`` in this process's environment, for the processes it starts from now
    on (its local Ray): the proof :func:`stop` asks for."""
    os.environ[RUN_ENV] = run_id


def started_by(pid: int | str, run_id: str) -> bool:
    """Whether process ``pid`` was started with ``run_id`` as :data:`RUN_ENV` (its
    environment as it started, from ``/proc``); ``False`` when it cannot be read.

    Example:
        >>> started_by(os.getpid(), "no-such-run")
        False
    """
    if not run_id:
        return False
    with contextlib.suppress(OSError):
        entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        return f"{RUN_ENV}={run_id}".encode() in entries
    return False


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


def _cmdline(pid: int | str) -> str:
    with contextlib.suppress(OSError):
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    return ""


def ray_orphan(pid: int | str) -> bool:
    """Whether ``pid`` is a Ray process (titled ``ray::...``) that no Ray owns any more: its
    parent is neither a raylet nor another Ray process (its raylet died; it was reparented).

    Example:
        >>> ray_orphan(os.getpid())
        False
    """
    if not _cmdline(pid).startswith("ray::"):
        return False
    with contextlib.suppress(OSError, IndexError):
        parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        owner = _cmdline(parent)
        return "raylet" not in owner and "gcs_server" not in owner and "ray::" not in owner
    return False


def stop(recorded: Iterable[Sequence[str]], run_id: str) -> int:
    """SIGKILLs each recorded ``[pid, start time]`` that is still that process and was started
    by run ``run_id`` (:func:`started_by`), or is a Ray process no Ray owns (:func:`ray_orphan`);
    a pid now held by another process, with another start time, or any other process, is left
    alone. Returns how many it killed."""
    killed = 0
    for pid, start in (tuple(map(str, r)) for r in recorded if len(r) == 2):
        proven = started_by(pid, run_id) or ray_orphan(pid)
        if start and proc(pid) == (pid, start) and proven:
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
                killed += 1
    return killed


_WATCHERS: list[tuple[subprocess.Popen[bytes], int]] = []
"""The watchers this process started and the write end of each one's pipe, held open (the
driver's death closes it)."""

WATCH_S = 0.5
"""How often the watcher looks for the processes the Ray it follows started."""


def watch_over(roots: Sequence[int]) -> subprocess.Popen[bytes] | None:
    """Starts the watcher of this driver's local Ray (``roots``: its first processes), which
    kills them and what they started once this process is gone (module docstring). Returns it,
    ``None`` without ``/proc``."""
    if not roots or not Path("/proc/self/stat").exists():
        return None
    read, write = os.pipe()  # not inheritable: no other child of the driver holds it open
    try:
        watcher = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__, *map(str, roots)],
            stdin=read,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a signal to the driver's group leaves it to its work
        )
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    _WATCHERS.append((watcher, write))
    return watcher


def _watch(roots: list[int]) -> int:
    """The watcher's loop: notes ``roots`` and their descendants (pid and start time) until
    standard input ends, then kills those still the same processes; returns how many."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    seen: dict[str, str] = {}
    while True:
        seen.update(proc(pid) for pid in tree(roots))
        seen.pop("", None)
        ready, _, _ = select.select([sys.stdin.buffer], [], [], WATCH_S)
        if ready and not os.read(sys.stdin.fileno(), 4096):  # the driver is gone
            break
    seen.update(proc(pid) for pid in tree(roots))  # and what started since the last look
    seen.pop("", None)
    killed = 0
    for pid, start in seen.items():
        if proc(pid) == (pid, start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), signal.SIGKILL)
                killed += 1
    return killed


if __name__ == "__main__":  # the watcher (watch_over)
    _watch([int(pid) for pid in sys.argv[1:]])
