"""A local Ray head for the scale benchmarks: ``ray start --head`` with logical CPUs and token
auth, started and stopped by the benchmark (only the processes it started are stopped).

Every contender then joins it as a driver at :attr:`Head.address` with ``RAY_AUTH_MODE=token``
(Ray 2.60 turns token authentication on for ``ray start --head``).
"""

from __future__ import annotations

import contextlib
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
from pathlib import Path

from search.compute.cluster import NO_PRESTART

REPO = Path(__file__).resolve().parents[1]
RAY_ENV = {
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    "RAY_CHDIR_TO_TRIAL_DIR": "0",
    "RAY_AIR_NEW_OUTPUT": "0",
}
"""What ``search.compute.cluster`` sets for its own trials; given to every contender alike."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_TOKEN = Path(tempfile.gettempdir()) / f"scale-bench-token-{os.getpid()}"
"""This benchmark's own token (never ``~/.ray/auth_token``, which other Rays may use)."""


def driver_env() -> dict[str, str]:
    """The environment of the head and of a contender's driver: token auth, with the
    benchmark's own token file, and the repository importable by Ray's workers."""
    if "SCALE_TOKEN_PATH" not in os.environ:
        _TOKEN.write_text(secrets.token_hex(32))
        _TOKEN.chmod(0o600)
        os.environ["SCALE_TOKEN_PATH"] = str(_TOKEN)
    path = os.environ.get("PYTHONPATH", "")
    return {
        **os.environ,
        **RAY_ENV,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": os.environ["SCALE_TOKEN_PATH"],
        "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO),
    }


class Head:
    """``ray start --head --block`` in its own process group, on 127.0.0.1.

    Args:
        num_cpus: Logical CPUs the head offers (sleeping trials need no real core each).
    """

    def __init__(self, num_cpus: int = 64) -> None:
        self.port = _free_port()
        self._temp = tempfile.mkdtemp(prefix="scale-ray-")
        self.address = f"127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115  (open while the head runs)
            prefix="scale-head-", suffix=".log", delete=False
        )
        cmd = [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--head",
            "--block",
            f"--port={self.port}",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus}",
            # Its own temp dir: ``ray start`` writes the cluster's address there, and a plain
            # ``ray.init()`` anywhere on the machine joins the cluster that file names (other
            # people's tests and runs would land on this head).
            f"--temp-dir={self._temp}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            # No idle workers prestarted (as a run's own Ray, search/compute/cluster.py): by
            # default the head prestarts one per logical CPU for the first driver to join, 64
            # Python processes started on 2 cores, charged to whichever contender runs first.
            f"--system-config={json.dumps(NO_PRESTART)}",
        ]
        self._proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=driver_env(),
            cwd=REPO,
            start_new_session=True,
        )
        self._wait_up()

    def _wait_up(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"ray start failed: {Path(self._log.name).read_text()[-2000:]}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    time.sleep(2.0)  # the raylet registers just after the GCS listens
                    return
            time.sleep(0.5)
        raise RuntimeError(f"ray head not up after {timeout:.0f} s")

    def stop(self) -> None:
        """Stops the head and everything it started (its own process group), nothing else."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        with contextlib.suppress(ProcessLookupError):  # stragglers of the group, if any
            os.killpg(self._proc.pid, signal.SIGKILL)
        shutil.rmtree(self._temp, ignore_errors=True)
        if os.environ.get("SCALE_TOKEN_PATH") == str(_TOKEN):
            _TOKEN.unlink(missing_ok=True)

    def __enter__(self) -> Head:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
