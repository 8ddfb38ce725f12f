"""The study's PostgreSQL server stops mid-study and comes back: the run waits it out, says
so in two lines, and finishes its budget; one that stays away past the limit stops the run
with one line, and the next run settles what it left."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest

from search.record.resume import counts
from tests.helpers import (
    PG_BINS,
    base_spec,
    free_port,
    start_run,
    wait_for_a_running_trial,
    write_spec,
)
from tests.helpers import PG_USER as USER

pytestmark = [pytest.mark.slow]

BUDGET = 6
AS_OWNER = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


@dataclass(frozen=True)
class Server:
    """A PostgreSQL server of this test's own, stopped and started at will."""

    bin_dir: Path
    data: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/optuna"

    def ctl(self, *args: str) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.data.parent} -c fsync=off"
        subprocess.run(
            [*AS_OWNER, str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-o", options,
             "-l", str(self.data.parent / "server.log"), "-w", "-t", "60", *args],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip


def _port_outside_the_ephemeral_range() -> int:
    """A free port below the kernel's ephemeral range (and above Ray's worker ports): while
    the server is stopped, no ``bind(0)`` and no outgoing connection of the other tests' Rays
    can take its port (``pg_ctl start`` failed so, in two of three fresh-clone runs)."""
    import random
    import socket

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.Random().sample(range(20000, max(20001, low)), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


@pytest.fixture
def server() -> Iterator[Server]:
    if not PG_BINS:
        pytest.skip("PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin/initdb)")
    root = Path(tempfile.mkdtemp(prefix="search-outage-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    found = Server(Path(PG_BINS[-1]).parent, root / "data", _port_outside_the_ephemeral_range())
    subprocess.run(
        [*AS_OWNER, str(found.bin_dir / "initdb"), "-D", str(found.data), "-U", USER,
         "--auth=trust", "--no-sync"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    found.ctl("start")
    try:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=found.port, user=USER, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute("CREATE DATABASE optuna")
        yield found
    finally:
        subprocess.run(
            [*AS_OWNER, str(found.bin_dir / "pg_ctl"), "-D", str(found.data), "-m", "immediate",
             "stop"], capture_output=True, timeout=60,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def _spec(tmp_path: Path, server: Server) -> Path:
    data = base_spec(
        tmp_path,
        storage=server.url,
        budget={"trials": BUDGET, "max_epochs": 3},
        fixed={"sleep": 0.5},
        asha={"enabled": False},
        sampler={"name": "random", "seed": 3},
    )
    return write_spec(tmp_path / "s.yaml", data)


def _trials(server: Server) -> tuple[Counter[str], int, int]:
    """The study's states, the trials that count, and how many configs ran twice."""
    trials = optuna.load_study(study_name="t", storage=server.url).trials
    params = [tuple(sorted(t.params.items())) for t in trials if t.params]
    return (
        Counter(t.state.name for t in trials),
        sum(map(counts, trials)),
        len(params) - len(set(params)),
    )


@pytest.mark.usefixtures("joins_session_ray")
def test_a_database_restart_mid_study_is_waited_out(
    tmp_path: Path, server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _spec(tmp_path, server)
    driver = start_run(spec)
    try:
        wait_for_a_running_trial(server.url, driver)
        server.ctl("-m", "fast", "stop")
        time.sleep(6.0)  # trials go on training meanwhile
        server.ctl("start")
        out, _ = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    states, counted, twice = _trials(server)
    with capsys.disabled():
        print(f"\ndatabase restart: exit {driver.returncode}; {dict(states)}; counted {counted}")
    went = [line for line in out.splitlines() if "stopped answering" in line]
    back = [line for line in out.splitlines() if "answers again, after" in line]
    assert driver.returncode == 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert len(went) == 1 and len(back) == 1, out[-3000:]
    assert states["RUNNING"] == 0 and states["WAITING"] == 0, dict(states)
    assert counted == BUDGET and twice == 0, dict(states)


@pytest.mark.usefixtures("joins_session_ray")
def test_a_database_away_past_the_limit_stops_the_run_in_one_line_and_the_next_run_settles(
    tmp_path: Path, server: Server
) -> None:
    spec = _spec(tmp_path, server)
    driver = start_run(spec, env={**os.environ, "SEARCH_STORAGE_OUTAGE_S": "4"})
    try:
        wait_for_a_running_trial(server.url, driver)
        server.ctl("-m", "fast", "stop")
        out, _ = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        server.ctl("start")
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert driver.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert len(errors) == 1 and "did not answer for 4 s" in errors[0], out[-3000:]
    again = start_run(spec)
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out[-3000:]
    states, counted, twice = _trials(server)
    assert states["RUNNING"] == 0 and states["WAITING"] == 0, dict(states)
    assert counted == BUDGET and twice == 0, dict(states)
