"""``search.run`` and ``search.load`` from a plain script, and the spec's one-line errors.

The script defines its trainable in ``__main__`` (Ray ships it to the workers by value), hands
its data over as an object, runs, continues the study with a second ``run``, and reads it
back with ``search.load``; the test checks the record, what the result objects said about
it, and that a later command names the function it cannot import in one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

import search
from search.errors import SearchError, SpecError
from tests.helpers import REPO, free_port

SCRIPT = """
import json, sys
import search

def train(config, data, ctx):
    for epoch in range(1, ctx.max_epochs + 1):
        yield {"loss": (config["x"] - data["target"]) ** 2 + 1.0 / epoch}

SPEC = '''
study: script
storage: sqlite:///STORE
objective: {metric: loss, mode: min}
budget: {trials: 3, max_epochs: 3}
space: {x: {uniform: [-1.0, 1.0]}}
resources: {cpus_per_trial: 1}
'''

if __name__ == "__main__":
    first = search.run(SPEC.replace("STORE", sys.argv[1]), trainable=train, data={"target": 0.25})
    n_first = len(first.trials)  # the result reads the study live: count before the next run
    second = search.run(SPEC.replace("STORE", sys.argv[1]), trainable=train,
                        data={"target": 0.25}, trials=5)
    loaded = search.load("script", storage="sqlite:///" + sys.argv[1])
    print("RESULT " + json.dumps({
        "first": n_first, "second": second.trials[["number", "state"]].values.tolist(),
        "best_value": loaded.best_value, "best_config": loaded.best_config,
        "curves": loaded.curves.values.tolist(), "repr": repr(loaded),
    }))
"""


@pytest.mark.slow
def test_a_scripts_main_trainable_runs_continues_and_loads(
    tmp_path: Path, session_ray_address: str
) -> None:
    script, db = tmp_path / "train.py", tmp_path / "optuna.db"
    script.write_text(SCRIPT)
    done = subprocess.run(  # the script's runs join the session's Ray, as RAY_ADDRESS says
        [sys.executable, str(script), str(db)], cwd=tmp_path, capture_output=True, text=True,
        timeout=600, env={**os.environ, "RAY_ADDRESS": session_ray_address},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    said = json.loads(done.stdout.split("RESULT ", 1)[1])
    study = optuna.load_study(study_name="script", storage=f"sqlite:///{db}")
    trials = study.get_trials(deepcopy=False)
    assert said["first"] == 3 and len(trials) == 5  # the second run continued the study
    assert said["second"] == [[t.number, t.state.name] for t in trials]
    assert study.user_attrs["spec"]["trainable"] == "__main__:train"
    assert study.user_attrs["spec"]["data"]["loader"] == "__main__:data"
    assert said["best_value"] == study.best_value
    assert said["best_config"] == study.best_params
    curves = {(int(t), int(e), m): v for t, e, m, v in said["curves"]}
    assert curves == {
        (t.number, e, "loss"): v for t in trials for e, v in t.intermediate_values.items()
    }
    for line in ("study script", "best value", "2 trials this run"):  # the CLI's summary
        assert line in done.stdout + done.stderr
    complete = sum(t.state.name == "COMPLETE" for t in trials)
    assert f"study='script': {complete} complete" in said["repr"], said["repr"]
    # A later process cannot import the script's function: one line, no traceback.
    export = subprocess.run(
        [sys.executable, "-m", "search", "export", "script", "--storage", f"sqlite:///{db}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert export.returncode == 2, export.stderr
    assert "Traceback" not in export.stderr
    assert "'__main__:train' was defined in a notebook or a script" in export.stderr


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"study": "x", "trainable": "search.testing:curve"}, "search.run: objective: Field"),
        ("study: [unclosed", "search.run: YAML syntax error at line 1"),
        ("just text", "search.run: expected a mapping"),
        ("no/such/spec.yaml", "no/such/spec.yaml: cannot read file"),
        (42, "search.run: spec: expected a path, YAML text or a dict, got 42"),
    ],
)
def test_a_bad_spec_raises_one_spec_error_line(spec: object, expected: str) -> None:
    with pytest.raises(SpecError) as caught:
        search.run(spec)  # type: ignore[arg-type]
    assert str(caught.value).startswith(expected) and "\n" not in str(caught.value)


def test_run_joins_the_ray_that_ray_address_names_as_the_command_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("RAY_ADDRESS", address)
    spec = {
        "study": "x", "trainable": "search.testing:curve", "budget": {"trials": 1},
        "objective": {"metric": "loss", "mode": "min"}, "space": {"lr": {"uniform": [0, 1]}},
    }  # fmt: skip
    with pytest.raises(SearchError, match=f"cannot reach the Ray cluster at {address}"):
        search.run(spec, storage="sqlite:///:memory:")


def test_an_override_is_checked_as_the_spec_is() -> None:
    spec = {
        "study": "x", "trainable": "search.testing:curve",
        "objective": {"metric": "loss", "mode": "min"}, "space": {"lr": {"uniform": [0, 1]}},
    }  # fmt: skip
    with pytest.raises(SpecError, match=r"^search.run: budget.trials: .*greater than or equal"):
        search.run(spec, trials=0)


def test_load_names_the_studies_a_storage_has(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/optuna.db"
    optuna.create_study(study_name="there", storage=storage)
    with pytest.raises(SearchError, match="there"):
        search.load("missing", storage=storage)


def test_the_public_names_of_the_python_door_resolve() -> None:
    assert search.run.__module__ == "search.api" and search.load.__module__ == "search.result"
    assert search.SearchResult.__name__ == "SearchResult"
    with pytest.raises(AttributeError):
        search.nothing_of_that_name  # noqa: B018
