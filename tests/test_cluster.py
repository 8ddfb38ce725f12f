"""Many machines, on one: a real PostgreSQL server and a real two-node Ray cluster.

The study runs through the CLI (a subprocess, so the session's ``ray_local`` is untouched) with
``--address`` and a ``postgresql://`` storage, once with the password as ``${PGPASSWORD}`` and
once written into the URL. Trials must run on both nodes, every trial must end in PostgreSQL
with a final state, and the password must appear nowhere: not on the console, not in
``results/<study>/``, not in the study's stored spec, not in Ray's experiment folder
(``results/ray/<study>/``, pickles included) and not in Ray's own session logs.

Everything this module starts is stopped in teardown by process id (never ``ray stop``, which
would kill every Ray on the machine, the session's included).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest

from search.record.storage import redact
from tests.helpers import PG_USER as USER
from tests.helpers import REPO, Postgres, alive, base_spec, cli, free_port, write_spec
from tests.helpers import checked as _run

pytestmark = [pytest.mark.slow]

RAY = str(Path(sys.executable).with_name("ray"))
TERMINAL = {"COMPLETE", "PRUNED", "FAIL"}


# ------------------------------------------------------------------------------------ Ray


@dataclass(frozen=True)
class Cluster:
    address: str
    node_ids: tuple[str, ...]
    temp_dir: Path
    env: dict[str, str]
    """The environment of a driver on this machine: the token's file, no RAY_AUTH_MODE."""


def _procs() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process."""
    out = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            out[int(Path(stat).parent.name)] = (int(fields[1]), int(fields[2]))
    return out


def _kill_groups(groups: list[int]) -> None:
    """Stops the process groups this module started, and every descendant of theirs (Ray's
    workers make groups of their own)."""
    procs = _procs()
    mine = {pid for pid, (_, pgid) in procs.items() if pgid in groups}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _) in procs.items() if ppid in mine} - mine
        mine |= more
        grew = bool(more)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in mine:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(pid) for pid in mine):
            time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """``ray start --head`` plus a second ``ray start --address`` node, one CPU each, token
    authentication on, in a temp dir of their own."""
    temp_dir = Path(tempfile.mkdtemp(prefix="search-ray-"))
    token_file = temp_dir / "auth_token"
    token_file.write_text(secrets.token_hex(32))
    token_file.chmod(0o600)
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    node_env = {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    port = free_port()
    address = f"127.0.0.1:{port}"
    common = ["--num-cpus", "1", "--disable-usage-stats", "--temp-dir", str(temp_dir)]
    groups: list[int] = []

    def start(args: list[str]) -> None:
        proc = subprocess.Popen(
            [RAY, "start", *args, *common],
            env=node_env,
            cwd=temp_dir,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        groups.append(proc.pid)
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out

    try:
        start(
            [
                "--head",
                "--port",
                str(port),
                "--resources",
                '{"head_node": 1}',
                "--include-dashboard=false",
                "--ray-client-server-port",
                str(free_port()),
                "--dashboard-port",
                str(free_port()),
                "--dashboard-agent-listen-port",
                str(free_port()),
                "--metrics-export-port",
                str(free_port()),
            ]
        )
        start(
            [
                "--address",
                address,
                "--resources",
                '{"second_node": 1}',
                "--dashboard-agent-listen-port",
                str(free_port()),
                "--metrics-export-port",
                str(free_port()),
            ]
        )
        driver_env = {**base, "RAY_AUTH_TOKEN_PATH": str(token_file), "PYTHONPATH": str(REPO)}
        probe = (
            "import json, sys, time, ray\n"
            "from search.tuning.runner import init_ray\n"
            "init_ray(sys.argv[1])\n"
            "deadline = time.time() + 60\n"
            "while len(alive := [n['NodeID'] for n in ray.nodes() if n['Alive']]) < 2:\n"
            "    assert time.time() < deadline, ray.nodes()\n"
            "    time.sleep(0.5)\n"
            "print(json.dumps(alive))\n"
        )
        proc = _run([sys.executable, "-c", probe, address], env=driver_env, cwd=temp_dir)
        node_ids = tuple(json.loads(proc.stdout.strip().splitlines()[-1]))
        yield Cluster(address, node_ids, temp_dir, driver_env)
    finally:
        _kill_groups(groups)
        shutil.rmtree(temp_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------- tests


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return cli(*args, cwd=cwd, timeout=600, env=env)


def _files_holding(secret: str, *roots: Path) -> list[str]:
    """Every regular file under ``roots`` whose bytes contain ``secret``."""
    needle, found = secret.encode(), []
    for root in roots:
        for path in [root, *root.rglob("*")] if root.is_dir() else [root]:
            with contextlib.suppress(OSError):
                if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                    found.append(str(path))
    return found


def _database_text(postgres: Postgres) -> str:
    """Every row of every table in the ``optuna`` database, as text."""
    import psycopg

    with psycopg.connect(
        host="127.0.0.1",
        port=postgres.port,
        user=USER,
        password=postgres.password,
        dbname="optuna",
        connect_timeout=10,
    ) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        ]
        assert "trial_user_attributes" in tables and "study_user_attributes" in tables, tables
        rows = [list(conn.execute(f'SELECT * FROM "{table}"')) for table in tables]
    return repr(rows)


def _run_study(
    tmp: Path,
    cluster: Cluster,
    postgres: Postgres,
    study: str,
    url: str,
    trials: int,
    with_env_password: bool,
    sleep: float,
) -> tuple[subprocess.CompletedProcess, optuna.Study]:
    (tmp / "specs").mkdir(exist_ok=True)  # the one place the literal password may be
    spec = write_spec(
        tmp / "specs" / f"{study}.yaml",
        base_spec(
            tmp,
            study=study,
            storage=url,
            budget={"trials": trials, "max_epochs": 3},
            asha={"enabled": sleep < 1},
            fixed={"sleep": sleep},
            resources={"cpus_per_trial": 1, "max_concurrent": 2},
        ),
    )
    env = dict(cluster.env)
    env.pop("PGPASSWORD", None)  # libpq would use it even when the URL has none
    if with_env_password:
        env["PGPASSWORD"] = postgres.password
    proc = _cli(
        ["run", str(spec), "--address", cluster.address, "--results", str(tmp / "results")],
        env,
        tmp,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    done = optuna.load_study(study_name=study, storage=postgres.url(postgres.password))
    return proc, done


def _check_study(done: optuna.Study, trials: int, cluster: Cluster, url: str) -> set[str]:
    assert len(done.trials) == trials
    assert {t.state.name for t in done.trials} <= TERMINAL, [t.state for t in done.trials]
    assert all(t.user_attrs.get("epochs") for t in done.trials)
    assert done.user_attrs["spec"]["storage"] == redact(url)
    host = socket.gethostname()
    allowed = {f"{host}/{node_id[:12]}" for node_id in cluster.node_ids}
    nodes = {t.user_attrs["node"] for t in done.trials}
    assert nodes <= allowed, (nodes, allowed)
    return nodes


def test_study_on_two_nodes_in_postgres_leaks_no_password(
    cluster: Cluster, postgres: Postgres, tmp_path: Path
) -> None:
    password = postgres.password
    env_url = postgres.url("${PGPASSWORD}")
    # Trials of ~4 s, no pruning: the second node's actor starts (seconds, on a busy machine)
    # well before the first node's trial ends, so Tune cannot reuse one actor for everything.
    proc, done = _run_study(tmp_path, cluster, postgres, "cluster-env", env_url, 6, True, 1.3)
    nodes = _check_study(done, 6, cluster, env_url)
    assert len(nodes) == 2, f"all trials ran on {nodes}"  # both machines worked

    literal_url = postgres.url(password)
    proc2, done2 = _run_study(
        tmp_path, cluster, postgres, "cluster-literal", literal_url, 3, False, 0.1
    )
    _check_study(done2, 3, cluster, literal_url)
    assert done2.user_attrs["spec"]["storage"] == postgres.url("***")

    listing = _cli(["trials", "cluster-literal", "--storage", literal_url], cluster.env, tmp_path)
    assert listing.returncode == 0, listing.stderr

    for output in (proc, proc2, listing):
        assert password not in output.stdout + output.stderr
    assert password not in _database_text(postgres)  # every row of every table of the study
    results = tmp_path / "results"
    for study in ("cluster-env", "cluster-literal"):
        assert (results / study / "trials.csv").is_file()
        assert (results / study / "best.yaml").is_file()
        assert list((results / "ray" / study).rglob("*.pkl")), "no Ray experiment state"
    outside_specs = [p for p in tmp_path.iterdir() if p.name != "specs"]
    leaks = _files_holding(password, *outside_specs, cluster.temp_dir)
    assert not leaks, f"the password is in {leaks}"


def test_wrong_password_and_wrong_token_fail_before_any_trial(
    cluster: Cluster, postgres: Postgres, tmp_path: Path
) -> None:
    wrong = "Wrong" + secrets.token_hex(6)
    spec = write_spec(
        tmp_path / "s.yaml", base_spec(tmp_path, study="never", storage=postgres.url(wrong))
    )
    proc = _cli(["run", str(spec), "--address", cluster.address], cluster.env, tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {spec}: storage: cannot connect to {postgres.url('***')}")
    assert "password authentication failed" in lines[0]
    assert wrong not in proc.stdout + proc.stderr

    bad_token = tmp_path / "bad_token"
    bad_token.write_text(secrets.token_hex(32))
    spec = write_spec(tmp_path / "s.yaml", base_spec(tmp_path, study="never"))
    env = {**cluster.env, "RAY_AUTH_TOKEN_PATH": str(bad_token)}
    proc = _cli(["run", str(spec), "--address", cluster.address], env, tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        f"error: --address: the Ray cluster at {cluster.address} refused this driver"
    )
    assert not (tmp_path / "optuna.db").exists()  # no study, no trial
