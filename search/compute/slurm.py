"""A study on a SLURM allocation: the batch script :func:`batch_script` writes, and
:func:`submit`.

The script starts Ray across the job's nodes, a head on the first node and a worker on each
other one by ``srun``, and runs ``python -m search run SPEC --address`` on the head. Two jobs
on one node never collide (ray#59551): each Ray lives in a temp folder named by the job's id,
its components bind ports the kernel hands out (Ray's ``--port=0`` and friends; the head's
address is read back from the folder), and its token is the job's own (``RAY_AUTH_TOKEN``, so
no job rewrites ``~/.ray/auth_token``). The script stops what it started, by pid, never with
``ray stop``, which ends every Ray on the node.

Head and workers by ``srun`` rather than ``ray symmetric-run``: the ports and the folder are
ours to choose per job, and a one-node job needs no job step at all.

The time limit: ``--signal=B:USR1@GRACE`` asks SLURM to signal the script GRACE seconds
before the limit; the script passes SIGTERM to the driver, which stops as SIGTERM stops it
(its cut trials replaced by the next run), and with ``--requeue`` requeues the job, whose next
start continues the study: the lease, the resume and the checkpoints carry it. ``scancel`` and
preemption signal every process of the job, Ray's too: the driver records what it can, and the
next run of the study settles and replaces what it cut.

Example:
    >>> job = SlurmJob(name="search-cnn", nodes=1, time="2:00:00", gpus_per_node=1)
    >>> print("\\n".join(sbatch_lines(job, Path("/shared/results"))))  # doctest: +ELLIPSIS
    #SBATCH --job-name=search-cnn
    #SBATCH --nodes=1
    #SBATCH --ntasks-per-node=1
    #SBATCH --gpus-per-node=1
    #SBATCH --time=2:00:00
    #SBATCH --output=/shared/results/slurm/%x-%j.out
    #SBATCH --open-mode=append
    #SBATCH --signal=B:USR1@120
    #SBATCH --no-requeue
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from search.errors import SearchError, one_line
from search.record.storage import redact
from search.specs.schema import DEFAULT_STORAGE, load_spec, with_overrides

NODE_LOCAL = ("/tmp", "/var/tmp", "/dev/shm", "/run")
"""Folders each node has of its own: a study there is not the one the login node reads."""
DEFAULT_GRACE_S = 120
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_SCRIPT = Path(__file__).with_name("slurm_job.sh")


@dataclass(frozen=True)
class SlurmJob:
    """What ``sbatch`` is asked for, named as ``sbatch`` names it.

    Args:
        name: The job's name (``--job-name``), ``search-STUDY`` by default.
        nodes: Nodes of the allocation: Ray's head on the first, a worker on each other.
        gpus_per_node: GPUs on each node (``--gpus-per-node``), ``None`` to ask for none.
        cpus_per_node: CPUs on each node (``--cpus-per-task`` of its one task).
        time: The time limit as ``sbatch --time`` reads it (``90``, ``2:00:00``, ``1-12``).
        partition: ``--partition``, ``None`` for the cluster's default.
        account: ``--account``, ``None`` for the user's default.
        requeue: Requeue the job when its time limit stops the study.
        grace_s: Seconds before the limit at which the study is stopped.
        extra: More ``sbatch`` options, each one ``#SBATCH`` line (``--mem=64G``).
    """

    name: str
    nodes: int = 1
    gpus_per_node: int | None = None
    cpus_per_node: int | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    requeue: bool = False
    grace_s: int = DEFAULT_GRACE_S
    extra: tuple[str, ...] = field(default_factory=tuple)

    def time_s(self) -> int:
        """The time limit in seconds, 0 when none is asked (the partition's applies)."""
        return time_limit_s(self.time) if self.time else 0


def time_limit_s(text: str) -> int:
    """Seconds of a time limit written as ``sbatch --time`` reads it.

    Example:
        >>> [time_limit_s(t) for t in ("90", "5:30", "2:00:00", "1-12", "1-0:30", "0-1:00:05")]
        [5400, 330, 7200, 129600, 88200, 3605]
        >>> time_limit_s("INFINITE")  # no limit: the partition's own applies
        0

    Raises:
        SearchError: For a text ``sbatch`` would refuse.
    """
    if text.strip().upper() in ("INFINITE", "UNLIMITED"):
        return 0
    match = _TIME.match(text.strip())
    if match is None:
        raise SearchError(
            f"--time: expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS as sbatch "
            f"reads it, got {text!r}"
        )
    days, first, second, third = (int(g) if g else 0 for g in match.groups())
    if match.group(1):  # D-HH[:MM[:SS]]
        return days * 86400 + first * 3600 + second * 60 + third
    if match.group(4):  # HH:MM:SS
        return first * 3600 + second * 60 + third
    return first * 60 + second  # MM[:SS]


def check_job(job: SlurmJob) -> None:
    """Refuses in one line what ``sbatch`` would refuse later, or a grace the limit cannot hold."""
    if job.nodes < 1:
        raise SearchError(f"--nodes: expected 1 or more, got {job.nodes}")
    for name, value in (
        ("--gpus-per-node", job.gpus_per_node),
        ("--cpus-per-node", job.cpus_per_node),
    ):
        if value is not None and value < 1:
            raise SearchError(f"{name}: expected 1 or more, got {value}")
    if not 1 <= job.grace_s <= 65535:
        raise SearchError(f"--grace: expected seconds from 1 to 65535, got {job.grace_s}")
    if job.time_s() and job.time_s() <= job.grace_s:
        raise SearchError(
            f"--grace: {job.grace_s} s is not less than --time {job.time} "
            f"({job.time_s()} s): give a shorter --grace or a longer --time"
        )
    for line in job.extra:
        if not line.startswith("-"):
            raise SearchError(
                f"--sbatch: expected an sbatch option such as --mem=64G, got {line!r}"
            )


def sbatch_lines(job: SlurmJob, results: Path) -> list[str]:
    """The ``#SBATCH`` lines of the job; its output file is ``RESULTS/slurm/NAME-JOBID.out``,
    appended to by each start of a requeued job."""
    asked = {
        "job-name": job.name,
        "nodes": job.nodes,
        "ntasks-per-node": 1,
        "cpus-per-task": job.cpus_per_node,
        "gpus-per-node": job.gpus_per_node,
        "time": job.time,
        "partition": job.partition,
        "account": job.account,
        "output": results / "slurm" / "%x-%j.out",
        "open-mode": "append",
        "signal": f"B:USR1@{job.grace_s}",
    }
    lines = [f"#SBATCH --{key}={value}" for key, value in asked.items() if value is not None]
    lines.append("#SBATCH --requeue" if job.requeue else "#SBATCH --no-requeue")
    return lines + [f"#SBATCH {line}" for line in job.extra]


def check_shared(place: Path, what: str, workdir: Path) -> None:
    """Refuses a folder or file each node has of its own (``/tmp``, ``$TMPDIR``...) when the
    folder the job is submitted from is not there too: the job's nodes, and the login node
    that reads the study, would each see another one."""
    roots = [*NODE_LOCAL, *(os.environ[v] for v in ("TMPDIR",) if os.environ.get(v))]
    here = next((r for r in roots if _under(place, r)), None)
    if here is not None and not _under(workdir, here):
        raise SearchError(
            f"{what}: {place} is under {here}, a folder each node has of its own; give a place "
            f"on the filesystem the nodes share (the folder you submit from is {workdir})"
            + (" or a postgresql:// URL" if what == "--storage" else "")
        )


def _under(path: Path, root: str) -> bool:
    return path == Path(root) or Path(root) in path.parents


def sqlite_file(url: str, workdir: Path) -> Path | None:
    """The file of a ``sqlite:///`` URL, relative ones read from ``workdir``; else ``None``."""
    if not url.startswith("sqlite:///"):
        return None
    return workdir / url.removeprefix("sqlite:///").split("?", 1)[0]


def check_storage(url: str, field: str, workdir: Path, in_script: bool) -> None:
    """A job's storage: a file the nodes share or a server. One the script carries
    (``in_script``: given as ``--storage``) holds no literal password, which the script would
    keep in a file; ``${VAR}`` is read in the job, as sbatch hands it the submitting
    environment."""
    if in_script and redact(url) != url:
        raise SearchError(
            f"{field}: the URL holds a password, which the batch script would keep in a file; "
            "write it as ${PGPASSWORD} and export PGPASSWORD before you submit (sbatch hands "
            "your environment to the job)"
        )
    path = sqlite_file(url, workdir)
    if path is not None:
        check_shared(path.resolve(), field, workdir)


def batch_script(
    job: SlurmJob, run_args: list[str], workdir: Path, results: Path, command: str
) -> str:
    """The whole batch script: the ``#SBATCH`` lines, then ``slurm_job.sh`` with the job's
    values filled in (``run_args`` is the ``search run`` command, its ``--address`` to come)."""
    python = Path(sys.executable)
    values = {
        "SBATCH": "\n".join(sbatch_lines(job, results)),
        "COMMAND": command,
        "SELF": shlex.quote(str(script_path(results, job.name))),
        "WORKDIR": shlex.quote(str(workdir)),
        "PYTHON": shlex.quote(str(python)),
        "RAY": shlex.quote(str(_ray_command(python))),
        "RUN": " ".join(
            shlex.quote(arg) for arg in [str(python), "-m", "search", "run", *run_args]
        ),
        "REQUEUE": "1" if job.requeue else "0",
    }
    text = _SCRIPT.read_text()
    for key, value in values.items():
        text = text.replace(f"@@{key}@@", value)
    return text


def script_path(results: Path, name: str) -> Path:
    """Where :func:`submit` keeps a job's script: ``RESULTS/slurm/NAME.sbatch``."""
    return results / "slurm" / f"{name}.sbatch"


def _ray_command(python: Path) -> Path:
    beside = python.with_name("ray")
    if beside.exists():
        return beside
    found = shutil.which("ray")
    if found is None:
        raise SearchError(
            f"Ray's `ray` command is neither beside {python} nor on PATH; install ray"
        )
    return Path(found)


def submit(script: Path, text: str) -> str:
    """Writes the script and submits it with ``sbatch``; returns the job's id."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise SearchError(
            "sbatch not found on PATH: run `search slurm` on the cluster's login node, or add "
            "--dry-run to print the script"
        )
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(text)
    script.chmod(0o755)
    done = subprocess.run([sbatch, "--parsable", str(script)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SearchError(f"sbatch refused {script}: {one_line(done.stderr or done.stdout)}")
    return done.stdout.strip().split(";")[0]


def prepare(
    spec: Path, job: SlurmJob, options: dict[str, Any], command: str
) -> tuple[Path, str, Callable[[str], list[str]]]:
    """The script of a study's job, checked: where it goes, its text, and the lines that
    tell the user, once it is submitted, how to follow and stop it.

    ``options`` holds ``search run``'s overrides (``trials``, ``study``, ``storage``) and
    ``results``; the spec is read now, so a spec the run would refuse is refused before
    the job waits in the queue.
    """
    parsed = with_overrides(
        load_spec(spec),
        source=f"{spec} (with command-line options)",
        **{"budget.trials": options.get("trials"), "study": options.get("study"),
           "storage": options.get("storage")},
    )  # fmt: skip
    workdir = Path.cwd().resolve()
    results = (workdir / options["results"]).resolve()
    check_shared(results, "--results", workdir)
    given = options.get("storage") is not None
    check_storage(parsed.storage, "--storage" if given else f"{spec}: storage", workdir, given)
    job = replace(job, name=job.name or f"search-{parsed.study}")
    check_job(job)
    run_args = [str(spec), "--results", str(results)]
    for key in ("trials", "study", "storage"):
        if options.get(key) is not None:
            run_args += [f"--{key}", str(options[key])]
    script = script_path(results, job.name)
    text = batch_script(job, run_args, workdir, results, command)
    trials_cmd = f"search trials {parsed.study}" + (
        f" --storage '{redact(parsed.storage)}'" if parsed.storage != DEFAULT_STORAGE else ""
    )

    def watch(job_id: str) -> list[str]:
        return [
            f"submitted job {job_id} ({job.name}): the study {parsed.study} on {job.nodes} node(s)",
            f"  its output: {results / 'slurm' / f'{job.name}-{job_id}.out'}",
            f"  follow it:  squeue -j {job_id}; {trials_cmd}",
            f"  stop it:    scancel {job_id}; sbatch {script} continues the study",
        ]

    return script, text, watch
