"""A real single-node SLURM for the tests: Debian's ``munged``, ``slurmctld`` and ``slurmd``,
started in a folder of the test session's own, as the current user, and stopped by pid.

The node offers 8 logical CPUs (``slurmd`` trusts the config, ``SlurmdParameters=
config_overrides``), so two jobs of 2 CPUs each run at once on a 2-core machine: their trials
sleep. Every client command (``sbatch``, ``squeue``, ``scancel``, ``scontrol``) finds this
cluster through ``SLURM_CONF`` in :meth:`SlurmCluster.env`. A requeued job waits as long as
its credential lives before it starts again: 5 s here (``cred_expire``; SLURM's default is
120 s), and then starts at the scheduler's next pass: every second here (``sched_interval`` and
``bf_interval``; SLURM's are 60 s and 30 s, which kept a requeued job pending 25 s).
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
NODE_CPUS = 8


def have_slurm() -> bool:
    """Whether Debian's SLURM and munge are installed (``.ci/run`` installs them)."""
    return all(shutil.which(name) or Path(f"/usr/sbin/{name}").exists() for name in DAEMONS)


def _exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class SlurmCluster:
    """A running one-node SLURM: its config file and its daemons' processes."""

    root: Path
    processes: list[subprocess.Popen[bytes]]

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self, **more: str) -> dict[str, str]:
        """The environment a client command (and so a job it submits) runs with."""
        return {**os.environ, "SLURM_CONF": str(self.conf), **more}

    def command(self, *args: str, check: bool = True) -> str:
        """Runs a SLURM client command and returns its stdout."""
        done = subprocess.run(
            [_exe(args[0]), *args[1:]], env=self.env(), capture_output=True, text=True
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: {done.returncode} {done.stderr}")
        return done.stdout

    def job_state(self, job_id: str) -> str | None:
        """The job's state in ``squeue`` (``PENDING``, ``RUNNING``...), ``None`` once gone."""
        out = self.command("squeue", "--noheader", "--jobs", job_id, "--format=%T", check=False)
        return out.strip() or None

    def restarts(self, job_id: str) -> int:
        """How many times the job was requeued (``scontrol show job``'s ``Restarts``)."""
        out = self.command("scontrol", "show", "job", job_id, check=False)
        found = re.search(r"\bRestarts=(\d+)", out)
        return int(found.group(1)) if found else 0

    def wait_gone(self, job_id: str, poll_s: float = 1.0) -> None:
        """Waits until ``squeue`` no longer lists the job (no time budget: the job's own
        ``--time`` bounds it)."""
        while self.job_state(job_id) is not None:
            time.sleep(poll_s)


def _config(root: Path, user: str, host: str) -> str:
    return f"""\
ClusterName=searchtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket,cred_expire=5
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=sched_interval=1,bf_interval=1
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=10
InactiveLimit=0
MinJobAge=2
NodeName={host} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@contextmanager
def single_node_slurm(root: Path) -> Iterator[SlurmCluster]:
    """Starts munge and SLURM in ``root`` and stops them, by pid, at the end."""
    for sub in ("state", "spool"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    user, host = getpass.getuser(), socket.gethostname().split(".")[0]
    (root / "slurm.conf").write_text(_config(root, user, host))
    munged = [
        _exe("munged"), "--foreground", f"--socket={root}/munge.socket", f"--key-file={key}",
        f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
        f"--seed-file={root}/munged.seed", "--force",
    ]  # fmt: skip
    cluster = SlurmCluster(root, [])
    log = (root / "daemons.log").open("ab")
    try:
        for argv in (
            munged,
            [_exe("slurmctld"), "-D", "-i", "-f", str(cluster.conf)],
            [_exe("slurmd"), "-D", "-f", str(cluster.conf)],
        ):
            cluster.processes.append(
                subprocess.Popen(argv, stdout=log, stderr=log, env=cluster.env())
            )
            time.sleep(0.5 if argv is munged else 0)
        _wait_idle(cluster)
        yield cluster
    finally:
        for proc in reversed(cluster.processes):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


def _wait_idle(cluster: SlurmCluster) -> None:
    """Waits for the node to be idle; a daemon that died fails with its log."""
    while "idle" not in cluster.command("sinfo", "--noheader", "--format=%T", check=False):
        for proc in cluster.processes:
            if proc.poll() is not None:
                raise AssertionError(
                    f"{proc.args[0]} exited {proc.returncode}:\n"
                    + (cluster.root / "daemons.log").read_text()[-3000:]
                )
        time.sleep(0.5)
