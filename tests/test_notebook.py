"""``search.run`` in a real Jupyter kernel (ipykernel, driven by nbclient and jupyter_client).

- ``examples/notebook/search.ipynb`` top to bottom: a trainable defined in a cell, a search,
  the trials as a DataFrame, a second ``run`` that continues the study, an export; the
  outputs hold the live block and no terminal escape code, and the DataFrame's rows are the
  study's trials.
- The kernel's interrupt during a ``run``: ``KeyboardInterrupt`` once every trial is
  recorded (none RUNNING), the summary printed; the next ``run`` continues the study; the
  kernel's Ray stops with the kernel.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path
from typing import Any

import nbformat
import optuna
import psutil
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from tests.helpers import REPO

pytestmark = [pytest.mark.slow, pytest.mark.torch]

NOTEBOOK = REPO / "examples" / "notebook" / "search.ipynb"
ESCAPE = "\x1b["
ROW = re.compile(r"^(\d+)\s+(\d+)\s+(COMPLETE|PRUNED|FAIL)\b", re.M)


def texts(cell: Any) -> list[str]:
    """Every text a cell's outputs hold: streams, and each display's plain and HTML forms."""
    found = []
    for out in cell.get("outputs", []):
        found.append(out.get("text", ""))
        for kind in ("text/plain", "text/html"):
            found.append(out.get("data", {}).get(kind, ""))
        found += out.get("traceback", [])
    return found


def kernel_env() -> dict[str, str]:
    """The kernel's environment: this one, with the 2 CPUs a trial each of the tests share."""
    return {**os.environ, "SEARCH_NUM_CPUS": "2", "PYTHONPATH": str(REPO)}


def test_the_example_notebook_runs_searches_continues_and_exports(
    tmp_path: Path, session_ray_address: str
) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.km = client.create_kernel_manager()
    # Its runs join the session's Ray, as RAY_ADDRESS tells ``search.run``.
    client.start_new_kernel(env={**kernel_env(), "RAY_ADDRESS": session_ray_address})
    client.execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    everything = [t for c in code for t in texts(c)]
    assert not [t for t in everything if ESCAPE in t]  # no terminal escape code anywhere
    first_run, first_table, second_run = code[2], code[3], code[4]
    second_table = second_run  # the second run's cell ends with the whole table
    assert any("finished:" in t and "<pre>" in t for t in texts(first_run))  # the live block
    assert any("study notebook-mlp" in t for t in texts(first_run))  # the summary
    study = optuna.load_study(
        study_name="notebook-mlp", storage=f"sqlite:///{tmp_path}/results/optuna.db"
    )
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 8 and not [t for t in trials if t.state.name == "RUNNING"]
    shown = {(int(n), s) for _, n, s in ROW.findall("".join(texts(second_table)))}
    assert shown == {(t.number, t.state.name) for t in trials}
    assert len(ROW.findall("".join(texts(first_table)))) == 4  # the first run's own four
    assert any("4 trials this run" in t for t in texts(second_run))  # continued, not redone
    assert (tmp_path / "results" / "notebook-mlp" / "export" / "model.pt").is_file()


PREAMBLE = """
import time
import search

def train(config, data, ctx):
    for epoch in range(1, ctx.max_epochs + 1):
        time.sleep(data["sleep"])
        yield {"loss": config["x"] ** 2 + 1.0 / epoch}

SPEC = {"study": "interrupted", "objective": {"metric": "loss", "mode": "min"},
        "budget": {"trials": 4, "max_epochs": 40}, "asha": {"enabled": False},
        "space": {"x": {"uniform": [-1.0, 1.0]}}, "resources": {"cpus_per_trial": 1}}
"""


def execute(kc: Any, code: str, timeout: float = 300) -> tuple[dict[str, Any], list[str]]:
    """Runs ``code`` in the kernel; its reply's content and every text it output."""
    msg_id = kc.execute(code)
    outputs: list[str] = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        content = msg["content"]
        outputs += [content.get("text", ""), *content.get("data", {}).values()]
        outputs += content.get("traceback", [])
        if msg["msg_type"] == "status" and content["execution_state"] == "idle":
            break
    return kc.get_shell_msg(timeout=timeout)["content"], outputs


def running_trial(storage: str, seconds: float = 300) -> None:
    """Waits until a trial of the study reported an epoch (the run is under way)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        trials = []
        if Path(storage.removeprefix("sqlite:///")).exists():  # the run created it
            with contextlib.suppress(KeyError):  # not the study yet
                trials = optuna.load_study(study_name="interrupted", storage=storage).trials
        if any(t.intermediate_values for t in trials):
            return
        time.sleep(0.5)
    raise AssertionError("no trial reported an epoch")


def test_an_interrupted_run_is_recorded_and_the_next_run_continues(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/results/optuna.db"
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path), env=kernel_env())
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        assert execute(kc, PREAMBLE)[0]["status"] == "ok"
        msg_id = kc.execute("result = search.run(SPEC, trainable=train, data={'sleep': 0.5})")
        running_trial(storage)
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=300)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        trials = optuna.load_study(study_name="interrupted", storage=storage).trials
        assert trials and not [t for t in trials if t.state.name == "RUNNING"]
        assert {t.user_attrs.get("stopped_by") for t in trials if t.state.name == "PRUNED"} <= {
            "interrupt"
        }
        before = len(trials)
        # The next run in the same kernel continues the study, on the same Ray.
        content, out = execute(
            kc, "result = search.run(SPEC, trainable=train, data={'sleep': 0}, trials=6)"
        )
        assert content["status"] == "ok", re.sub(r"\x1b\[[0-9;]*m", "", "".join(out))[-3000:]
        after = optuna.load_study(study_name="interrupted", storage=storage).trials
        assert len(after) > before and [t.number for t in after] == list(range(len(after)))
        assert not [t for t in after if t.state.name == "RUNNING"]
        content, out = execute(
            kc, "from search.compute.cluster import local_ray_processes\n"
            "print('RAY', local_ray_processes())",
        )  # fmt: skip
        pids = [int(p) for p in re.findall(r"\d+", next(t for t in out if "RAY" in t))]
        assert pids
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    deadline = time.monotonic() + 120  # Ray's processes stop with the kernel
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.5)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert alive == []
