"""What optuna-dashboard shows, read back through its own HTTP API: metric names, the study's
note and each finished trial's artifacts (learning-curve PNG, metrics CSV, a model card).

The studies are built with Optuna directly (no Ray, no training); the dashboard runs in
process (``wsgiref`` on 127.0.0.1, a free port) and, once, as ``python -m search dashboard``.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from search.record.artifacts import attached, store_path
from search.record.queries import EPOCHS_FILE
from search.record.storage import open_storage
from search.report.artifacts import attach_file, publish_artifacts
from search.report.dashboard import ResultsArtifactStore, publish_study, study_note
from search.tuning.output import attach_output
from tests.helpers import REPO

pytestmark = pytest.mark.slow  # over 5 s here: make test-fast leaves it out

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SPACE = {"lr": FloatDistribution(1e-4, 1e-1, log=True)}


def _study(url: str, name: str, directions: list[str], metrics: list[str]) -> optuna.Study:
    study = optuna.create_study(study_name=name, storage=url, directions=directions)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(metrics)
    study.set_user_attr("spec", {"study": name, "storage": "sqlite:///results/optuna.db"})
    return study


def _trial(state: TrialState, curve: list[float], values: list[float] | None = None) -> Any:
    return create_trial(
        state=state,
        values=values if state == TrialState.COMPLETE else None,
        params={"lr": 0.01},
        distributions=SPACE,
        intermediate_values=dict(enumerate(curve, start=1)),
        user_attrs={"epochs": len(curve)},
    )


def _single(url: str, results: Path) -> optuna.Study:
    """#0 complete, #1 pruned (both in epochs.csv with two metrics), #2 failed after one
    epoch (intermediate values only), #3 failed before its first epoch (no artifacts)."""
    study = _study(url, "single", ["maximize"], ["val_accuracy"])
    study.add_trial(_trial(TrialState.COMPLETE, [0.5, 0.7, 0.9], [0.9]))
    study.add_trial(_trial(TrialState.PRUNED, [0.4]))
    study.add_trial(_trial(TrialState.FAIL, [0.3]))
    study.add_trial(_trial(TrialState.FAIL, []))
    (results / "single").mkdir(parents=True)
    with (results / "single" / EPOCHS_FILE).open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["trial", "epoch", "metric", "value"])
        for number, epochs in ((0, 3), (1, 1)):
            for epoch in range(1, epochs + 1):
                writer.writerow([number, epoch, "val_accuracy", 0.2 * epoch])
                writer.writerow([number, epoch, "val_loss", 1.0 / epoch])
    return study


def _multi(url: str) -> optuna.Study:
    """Two objectives: #0 and #1 on the front, #2 dominated by #0."""
    study = _study(url, "multi", ["maximize", "minimize"], ["val_accuracy", "latency_ms"])
    study.add_trial(_trial(TrialState.COMPLETE, [0.8, 0.9], [0.9, 5.0]))
    study.add_trial(_trial(TrialState.COMPLETE, [0.6, 0.7], [0.7, 1.0]))
    study.add_trial(_trial(TrialState.COMPLETE, [0.5, 0.6], [0.6, 6.0]))
    return study


def _get(base: str, path: str) -> tuple[bytes, str]:
    with urllib.request.urlopen(base + path, timeout=10) as response:
        return response.read(), response.headers.get("Content-Type", "")


def _api(base: str, path: str) -> Any:
    return json.loads(_get(base, path)[0])


def _dashboard_app(storage_url: str, results_dir: Path) -> Any:
    """optuna-dashboard's WSGI application with the artifact store ``search dashboard`` serves
    (:func:`search.report.dashboard.serve`), on a server a test can stop."""
    from optuna_dashboard import wsgi

    return wsgi(open_storage(storage_url), artifact_store=ResultsArtifactStore(results_dir))


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, Path, dict[str, optuna.Study]]]:
    """Both studies published once, and the dashboard's base URL serving them."""
    tmp_path = tmp_path_factory.mktemp("served")
    url, results = f"sqlite:///{tmp_path}/optuna.db", tmp_path / "results"
    studies = {"single": _single(url, results), "multi": _multi(url)}
    for study in studies.values():
        publish_study(study, results)
    server = make_server("127.0.0.1", 0, _dashboard_app(url, results), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", results, studies
    finally:
        server.shutdown()
        server.server_close()


def _detail(base: str, name: str) -> dict[str, Any]:
    summaries = _api(base, "/api/studies")["study_summaries"]
    study_id = next(s["study_id"] for s in summaries if s["study_name"] == name)
    return {"study_id": study_id, **_api(base, f"/api/studies/{study_id}")}


def _artifacts(detail: dict[str, Any]) -> dict[int, dict[str, dict[str, Any]]]:
    """Each trial's number mapped to its artifacts by file name, with the trial's id."""
    return {
        t["number"]: {a["filename"]: {**a, "trial_id": t["trial_id"]} for a in t["artifacts"]}
        for t in detail["trials"]
    }


def test_single_objective_study_shows_names_note_and_artifacts(served: Any) -> None:
    base, _, _ = served
    detail = _detail(base, "single")
    assert detail["objective_names"] == ["val_accuracy"]
    note = detail["note"]["body"]
    assert "4 (1 complete, 1 pruned, 2 fail)" in note and "epochs trained:** 5" in note
    assert "Best val_accuracy: 0.9 (trial #0)" in note
    assert "```yaml\nstudy: single\nstorage: sqlite:///results/optuna.db\n```" in note
    artifacts = _artifacts(detail)
    assert sorted(artifacts[0]) == ["trial-0000-curves.png", "trial-0000-metrics.csv"]
    assert sorted(artifacts[1]) == ["trial-0001-curves.png", "trial-0001-metrics.csv"]
    assert sorted(artifacts[2]) == ["trial-0002-curves.png", "trial-0002-metrics.csv"]
    assert artifacts[3] == {}  # failed before its first epoch: nothing to show
    sid = detail["study_id"]
    for number, files in artifacts.items():
        for name, meta in files.items():
            body, kind = _get(base, f"/artifacts/{sid}/{meta['trial_id']}/{meta['artifact_id']}")
            if name.endswith(".png"):
                assert body.startswith(PNG_MAGIC) and kind == "image/png", (number, name)
            else:
                assert kind == "text/csv", (number, name)
                assert body.decode().splitlines()[0] in (
                    "epoch,val_accuracy,val_loss",  # from epochs.csv: every metric
                    "epoch,val_accuracy",  # trial 2: its intermediate values
                )
    table, _ = _get(
        base,
        f"/artifacts/{sid}/{artifacts[0]['trial-0000-metrics.csv']['trial_id']}/"
        f"{artifacts[0]['trial-0000-metrics.csv']['artifact_id']}",
    )
    assert table.decode().splitlines()[1:] == [
        "1,0.2,1.0",
        "2,0.4,0.5",
        "3,0.6000000000000001,0.3333333333333333",
    ]


def test_multi_objective_study_and_an_attached_model_card(served: Any, tmp_path: Path) -> None:
    base, results, studies = served
    study = studies["multi"]
    card = tmp_path / "model_card.md"
    for text in ("# first card\n", "# second card\n"):  # attached again: replaced, not added
        card.write_text(text)
        attach_file(study, card, study.best_trials[0], results_dir=results)
    detail = _detail(base, "multi")
    assert detail["objective_names"] == ["val_accuracy", "latency_ms"]
    assert (
        "Pareto front: 2 trials (val_accuracy maximize, latency_ms minimize)"
        in (detail["note"]["body"])
    )
    artifacts = _artifacts(detail)
    assert all(f"trial-{n:04d}-curves.png" in artifacts[n] for n in range(3))
    best = study.best_trials[0].number
    assert sum(name == "model_card.md" for name in artifacts[best]) == 1
    meta = artifacts[best]["model_card.md"]
    body, _ = _get(
        base, f"/artifacts/{detail['study_id']}/{meta['trial_id']}/{meta['artifact_id']}"
    )
    assert body == b"# second card\n"


def test_publishing_again_adds_nothing_and_restores_a_lost_file(served: Any) -> None:
    base, results, studies = served
    before = _artifacts(_detail(base, "single"))
    assert publish_artifacts(studies["single"], results) == 0
    assert publish_study(studies["multi"], results) == 0
    folder = results / "single" / "artifacts"
    assert len(list(folder.iterdir())) == 6
    lost = folder / before[1]["trial-0001-curves.png"]["artifact_id"]
    lost.unlink()  # a results folder cleaned: the metadata stays, the bytes come back
    assert publish_artifacts(studies["single"], results) == 1
    assert lost.read_bytes().startswith(PNG_MAGIC) and len(list(folder.iterdir())) == 6
    assert _artifacts(_detail(base, "single")) == before


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_dashboard_command_publishes_and_serves_the_artifacts(tmp_path: Path) -> None:
    url, results = f"sqlite:///{tmp_path}/optuna.db", tmp_path / "results"
    _single(url, results)  # not published: the command does it before it serves
    port = _free_port()
    command = [sys.executable, "-m", "search", "dashboard", "--storage", url]
    proc = subprocess.Popen(
        [*command, "--port", str(port), "--results", str(results)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                detail = _detail(base, "single")
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.2)
        else:
            pytest.fail("the dashboard did not answer")
        assert "Best val_accuracy" in detail["note"]["body"]
        meta = _artifacts(detail)[0]["trial-0000-curves.png"]
        body, _ = _get(
            base, f"/artifacts/{detail['study_id']}/{meta['trial_id']}/{meta['artifact_id']}"
        )
        assert body.startswith(PNG_MAGIC)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_trials_output_is_attached_capped_to_its_end_with_every_ranks_file(
    tmp_path: Path,
) -> None:
    url, results = f"sqlite:///{tmp_path}/optuna.db", tmp_path / "results"
    study = _study(url, "logs", ["maximize"], ["val_accuracy"])
    study.add_trial(_trial(TrialState.COMPLETE, [0.5], [0.5]))
    log = tmp_path / "trial" / "output.log"
    log.parent.mkdir()
    text = "".join(f"line {n}\n" for n in range(1000))
    log.write_text(text)
    log.with_name("output.rank1.log").write_text("rank 1 says hello\n")
    names = attach_output(study, 0, log, results, limit=100)
    assert names == ["trial-0000-output.log", "trial-0000-output.rank1.log"]
    trial_id = study.trials[0]._trial_id
    ids = attached(study)[trial_id]
    folder = store_path(results, "logs")
    capped = (folder / ids["trial-0000-output.log"]).read_text()
    cut = text.index("\n", len(text) - 100) + 1  # the last 100 bytes, from a whole line
    assert capped == f"[first {cut} bytes left out]\n" + text[cut:]
    assert capped.splitlines()[1:3] == ["line 989", "line 990"]
    assert (folder / ids["trial-0000-output.rank1.log"]).read_text() == "rank 1 says hello\n"
    attrs = study._storage.get_study_system_attrs(study._study_id)
    key = next(k for k in attrs if k.endswith(ids["trial-0000-output.log"]))
    assert json.loads(attrs[key])["mimetype"] == "text/plain"
    assert attach_output(study, 0, None, results) == []  # never started: no output


NOTE_ALONE = """
import sys
import optuna
from search.report.dashboard import publish_note
study = optuna.create_study(storage=sys.argv[1], study_name="alone")
publish_note(study)
print("optuna_dashboard" in sys.modules, "sklearn" in sys.modules)
"""


def test_the_end_of_a_run_writes_the_note_without_the_dashboards_web_app(tmp_path: Path) -> None:
    """The note costs no import of optuna-dashboard's app (scikit-learn with it, 1.2 s at the
    end of every run), and the dashboard's own reader finds it."""
    from optuna_dashboard import get_note

    storage = f"sqlite:///{tmp_path}/o.db"
    done = subprocess.run(
        [sys.executable, "-c", NOTE_ALONE, storage], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False"]
    study = optuna.load_study(study_name="alone", storage=storage)
    assert get_note(study) == study_note(study) != ""
