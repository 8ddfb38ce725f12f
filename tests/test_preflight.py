"""Checks before the first trial: an unreachable storage or Ray cluster fails in one line, fast.

None of these needs a server: the "unreachable" ones point at a free port on 127.0.0.1.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from search.cli import app
from search.record.storage import expand, redact
from search.specs.schema import parse_spec
from search.tuning.preflight import (
    PreflightError,
    check_data,
    check_ray_address,
    check_storage,
    use_cluster_token,
)
from tests.helpers import REPO, base_spec, run_spec, write_spec

SECRET = "pw-Zq81rT"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _one_line(exc: pytest.ExceptionInfo[PreflightError]) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    assert SECRET not in text, text
    return text


@pytest.mark.parametrize("password", [SECRET, "${SEARCH_TEST_PW}"])
def test_unreachable_postgres_fails_fast_naming_the_field(
    monkeypatch: pytest.MonkeyPatch, password: str
) -> None:
    monkeypatch.setenv("SEARCH_TEST_PW", SECRET)
    url = f"postgresql://bob:{password}@127.0.0.1:{free_port()}/optuna"
    start = time.monotonic()
    with pytest.raises(PreflightError) as exc:
        check_storage(url, "spec.yaml: storage")
    assert time.monotonic() - start < 10
    text = _one_line(exc)
    assert text.startswith(f"spec.yaml: storage: cannot connect to {redact(url)} (")
    assert "Connection refused" in text


def test_storage_url_problems_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEARCH_TEST_UNSET", raising=False)
    cases = {
        "postgresql://bob:${SEARCH_TEST_UNSET}@db/optuna": "environment variable "
        "SEARCH_TEST_UNSET is not set",
        "not a url": "is not a usable storage URL",
        f"nosuchdialect://bob:{SECRET}@db/x": "is not a usable storage URL",
        f"sqlite:///{tmp_path}": "is a folder, not a SQLite file",
        f"sqlite:///{REPO / 'README.md'}": "exists and is not a SQLite database",
    }
    for url, expected in cases.items():
        with pytest.raises(PreflightError) as exc:
            check_storage(url)
        text = _one_line(exc)
        assert text.startswith("storage: ") and expected in text, text


def test_a_new_sqlite_file_passes_and_nothing_is_created(tmp_path: Path) -> None:
    check_storage(f"sqlite:///{tmp_path}/new/deeper/optuna.db")
    check_storage("sqlite:///:memory:")
    assert list(tmp_path.iterdir()) == []


def test_passwords_with_url_characters_stay_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlalchemy

    monkeypatch.setenv("SEARCH_TEST_PW", "a@b/c:d%e")
    url = expand("postgresql://bob:${SEARCH_TEST_PW}@db:5432/optuna")
    parsed = sqlalchemy.engine.make_url(url)
    assert (parsed.password, parsed.host, parsed.database) == ("a@b/c:d%e", "db", "optuna")
    assert redact(f"postgresql://:{SECRET}@db/x?password={SECRET}").count(SECRET) == 0


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        (
            "127.0.0.1:{port}",
            "cannot reach the Ray cluster at 127.0.0.1:{port} (Connection refused)",
        ),
        ("ray://127.0.0.1:{port}", "cannot reach the Ray cluster at ray://127.0.0.1:{port}"),
        ("no-such-host.invalid:6379", "cannot reach the Ray cluster at no-such-host.invalid"),
        ("http://head:6379", "expected HOST:PORT of a Ray head node, got 'http://head:6379'"),
        ("head:99999", "expected HOST:PORT"),
    ],
)
def test_unknown_ray_address_fails_fast(address: str, expected: str) -> None:
    port = free_port()
    start = time.monotonic()
    with pytest.raises(PreflightError) as exc:
        check_ray_address(address.format(port=port), timeout_s=2)
    assert time.monotonic() - start < 10
    assert _one_line(exc).startswith(f"--address: {expected.format(port=port)}")


def test_local_addresses_need_no_check() -> None:
    for address in (None, "local", "auto"):
        check_ray_address(address)


def test_cluster_token_is_used_when_joining(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    use_cluster_token("10.0.0.1:6379")  # no token anywhere: leave Ray's default alone
    assert "RAY_AUTH_MODE" not in os.environ
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("t" * 32)
    use_cluster_token(None)  # a local Ray decides for itself
    use_cluster_token("local")
    assert "RAY_AUTH_MODE" not in os.environ
    use_cluster_token("10.0.0.1:6379")
    assert os.environ["RAY_AUTH_MODE"] == "token"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # an explicit choice wins
    use_cluster_token("10.0.0.1:6379")
    assert os.environ["RAY_AUTH_MODE"] == "disabled"


def test_missing_data_folder(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    spec = parse_spec(base_spec(tmp_path, data={"name": "image_folder", "path": str(missing)}))
    with pytest.raises(PreflightError) as exc:
        check_data(spec)
    assert _one_line(exc) == f"data.path: {missing} does not exist"
    afile = tmp_path / "file.txt"
    afile.write_text("x")
    spec = parse_spec(base_spec(tmp_path, data={"name": "image_folder", "path": str(afile)}))
    with pytest.raises(PreflightError) as exc:
        check_data(spec)
    assert _one_line(exc) == f"data.path: {afile} is not a folder"
    check_data(parse_spec(base_spec(tmp_path)))  # digits: nothing to check

    path = write_spec(
        tmp_path / "s.yaml",
        base_spec(tmp_path, data={"name": "image_folder", "path": str(missing)}),
    )
    code, output = _invoke("run", str(path), "--results", str(tmp_path / "results"))
    assert code == 2 and output.strip() == f"error: {path}: data.path: {missing} does not exist"
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / "results").exists()


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_cli_unreachable_storage_exits_2_before_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEARCH_TEST_PW", SECRET)
    port = free_port()
    for password in (SECRET, "${SEARCH_TEST_PW}"):
        url = f"postgresql://bob:{password}@127.0.0.1:{port}/optuna"
        spec = write_spec(tmp_path / "s.yaml", base_spec(tmp_path, storage=url))
        code, output = _invoke("run", str(spec), "--results", str(tmp_path / "results"))
        lines = output.strip().splitlines()
        assert code == 2 and len(lines) == 1, output
        assert lines[0].startswith(f"error: {spec}: storage: cannot connect to {redact(url)}")
        assert SECRET not in output
        code, output = _invoke("run", str(spec), "--storage", url)
        assert code == 2 and output.startswith("error: --storage: cannot connect"), output
        assert SECRET not in output
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("given_by", ["--address", "RAY_ADDRESS"])
def test_cli_unknown_ray_address_exits_2_before_anything(tmp_path: Path, given_by: str) -> None:
    """A real subprocess: Ray itself would wait minutes for a cluster that is not there. The
    address comes from the option or, as for Ray's own tools, from ``RAY_ADDRESS``."""
    spec = write_spec(tmp_path / "s.yaml", base_spec(tmp_path))
    address = f"127.0.0.1:{free_port()}"
    by_option = given_by == "--address"
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "search", "run", str(spec), *(["--address", address] * by_option)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), **({} if by_option else {given_by: address})},
    )
    assert time.monotonic() - start < 60
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: --address: cannot reach the Ray cluster at {address} (Connection refused); "
        "start it with `ray start --head` or fix the address"
    ]
    assert not (tmp_path / "optuna.db").exists()  # no study, no trial
    assert not (tmp_path / "results").exists()


def broken_loader() -> None:
    """A ``data.loader`` that raises (``tests.test_preflight:broken_loader``)."""
    raise FileNotFoundError("no such file: train.csv")


@pytest.mark.usefixtures("joins_session_ray")
def test_a_loader_that_raises_stops_the_run_in_one_line_and_leaves_no_study(
    tmp_path: Path,
) -> None:
    data = base_spec(tmp_path, data={"loader": "tests.test_preflight:broken_loader"})
    spec = write_spec(tmp_path / "s.yaml", data)
    done = run_spec(spec)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "data.loader" in lines[0] and "FileNotFoundError" in lines[0]
    assert optuna.get_all_study_names(data["storage"]) == []  # the dashboard lists nothing
